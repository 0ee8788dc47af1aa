"""What an attention map is, below everything that reads or writes one: the encodings a store keeps beside its maps.

Nothing here knows of jobs, runs, models or files; each encoding is a frozen object that owns its settings
(``to_dict`` / ``from_dict``, recorded in the store's attributes) and turns arrays into their stored form and back
(``encode`` / ``decode``), so the store stays readable by plain zarr plus the formula its attributes name.
"""

from .norm_code import NORM_CODE, WEIGHTINGS, NormCode, norm_shares, norm_weighted, reweigh

__all__ = ["NORM_CODE", "WEIGHTINGS", "NormCode", "norm_shares", "norm_weighted", "reweigh"]
