"""What an attention map is, below everything that reads or writes one: its tokens, its statistics, its profile and
the encodings a store keeps it in.

- :mod:`.tokens`: the special tokens by their text, a feature's token masks, the masks of the maps handed to one
  call (:class:`~attnclust.maps.tokens.TokenContext`);
- :mod:`.stats`: the per-map statistics, each declared in a registry beside its code;
- :mod:`.profile`: the profile, a map as a short length-invariant vector of behaviour fractions;
- :mod:`.compact_code`: a compact store's square-root byte code of each row's largest weights (:class:`CompactCode`);
- :mod:`.norm_code`: the log byte code of each key's value-vector norm (:class:`NormCode`) and the norm-weighted map.

Nothing here knows of jobs, runs, models or files; each encoding is a frozen object that owns its settings
(``to_dict`` / ``from_dict``, recorded in the store's attributes) and turns arrays into their stored form and back
(``encode`` / ``decode``), so the store stays readable by plain zarr plus the formula its attributes name.
"""

from .compact_code import COMPACT_ENCODING, COMPACT_SPREADS, CompactCode
from .norm_code import NORM_CODE, WEIGHTINGS, NormCode, norm_shares, norm_weighted, reweigh

__all__ = ["COMPACT_ENCODING", "COMPACT_SPREADS", "NORM_CODE", "WEIGHTINGS", "CompactCode", "NormCode", "norm_shares",
           "norm_weighted", "reweigh"]
