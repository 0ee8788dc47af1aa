"""The probe's fits and its null (:mod:`attnclust.analysis.probes`; the question modes use the same folds and null,
:mod:`attnclust.analysis.modes`).

- :func:`fit_logistic`: L2-regularised logistic regressions fitted by Newton steps (IRLS), batched over the
  permutations and classes of a head, and over heads where each head's fit is small
  (:func:`fit_logistic_designs`, :func:`designs_per_fit`), solved in the samples' space where a design has fewer
  samples than dimensions (the [CLS] state, the top-k heads): the same optimum as
  ``sklearn.linear_model.LogisticRegression(C=1)``, at a cost that allows thousands of refits;
- :func:`probe_fold_ids`: folds that keep each example's features together and balance the classes over examples
  (scikit-learn's ``StratifiedKFold`` on one label per example), 5 or as many as the rarest class has examples;
- :func:`permuted_labels`, :func:`permutation_p_values`: labels shuffled among whole examples within each fold (an
  exact null), and the p-values of the scores they give, per head or pooled over heads.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INTERCEPT_RIDGE", "MAX_FOLDS", "designs_per_fit", "fit_logistic", "fit_logistic_designs",
           "permutation_p_values", "permuted_labels", "predict_logistic", "probe_fold_ids"]

MAX_FOLDS = 5
"""At most this many cross-validation folds."""

INTERCEPT_RIDGE = 1e-10
"""The intercept's ridge in every fit: not penalised as scikit-learn's is not, but a tiny ridge keeps the Newton step
defined."""


def fit_logistic(x, targets, *, c: float = 1.0, iterations: int = 30, tol: float = 1e-9):
    """L2-regularised binary logistic regressions on one design, fitted together by Newton steps (IRLS).

    Minimises ``sum_i log(1 + exp(-s_i (x_i . w + b))) + |w|^2 / (2 c)`` (the intercept is not penalised), the
    objective of ``sklearn.linear_model.LogisticRegression(C=c)``, for every row of ``targets``.

    Parameters
    ----------
    x : torch.Tensor, shape (sample, dim) or (design, sample, dim)
        float64 design (standardised), shared by every problem; or several designs (one per head), each fitted to
        every problem (:func:`fit_logistic_designs`).
    targets : torch.Tensor, shape (problem, sample)
        0/1 targets, one problem per row.
    c
        Inverse regularisation strength.
    iterations, tol
        At most this many Newton steps; stop when no coefficient moves more than ``tol``.

    Returns
    -------
    torch.Tensor, shape (problem, dim + 1) or (design, problem, dim + 1)
        Coefficients, the intercept last.
    """
    import torch

    if x.dim() == 3:
        return fit_logistic_designs(x, targets, c=c, iterations=iterations, tol=tol)
    if x.shape[1] + 1 > targets.shape[0]:
        # few problems of many dimensions (the top-k heads, the [CLS] state): each sample's outer product (below)
        # would be larger than a weighted copy of the design per problem (1,600 x 385^2 doubles, 1.9 GB)
        if x.shape[0] < x.shape[1]:  # and fewer samples than dimensions: the steps in the samples' space
            return _fit_logistic_samples(x, targets, c=c, iterations=iterations, tol=tol)
        return fit_logistic_designs(x[None], targets, c=c, iterations=iterations, tol=tol)[0]

    xb = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)  # (sample, dim + 1)
    d = xb.shape[1]
    theta = torch.zeros(targets.shape[0], d, dtype=x.dtype)
    reg = torch.full((d,), 1.0 / c, dtype=x.dtype)
    reg[-1] = INTERCEPT_RIDGE
    # With more problems than dimensions, each sample's outer product is formed once and every problem's Hessian
    # X^T W X is one matrix product with the weights (problem, sample): 4.5x faster than a weighted copy of the
    # design per problem for 147 problems of 1,600 samples x 33 (28 vs 126 ms, the same coefficients to 2e-16).
    # The default probes of a 2,077-feature run (740 fits, MiniLM): 30 s in all, 112 s before.
    # The Hessian is symmetric and positive definite (the ridge): the products of its upper triangle only, put in
    # place in a matrix whose lower triangle stays 0, and the step by its Cholesky factor, which reads the upper
    # triangle only (LU read both, so the triangle was mirrored first: bench/HISTORY.md, 2026-12-07, night). A
    # problem whose step fell below ``tol`` is done: the next steps run only the problems still moving (each
    # problem's iterates are those it had when all ran together, to rounding). The step solves U^T U s = g by two
    # triangular solves: the same numbers as the batched cholesky_solve, which took 1.6x as long for 147 systems of
    # 33. (Starting a fold's fits from the last fold's coefficients saved a sixth of the steps, but a Newton step
    # without a line search is safe from zeros only: from there some of the demo's qword fits diverged.)
    upper = torch.triu_indices(d, d)
    outer = xb[:, upper[0]] * xb[:, upper[1]]  # (sample, d (d + 1) / 2)
    at = torch.full((d, d), -1, dtype=torch.long)
    at[upper[0], upper[1]] = torch.arange(upper.shape[1])
    flat = upper[0] * d + upper[1]  # each upper entry's place in a row-major (d, d) matrix
    reg_upper = torch.zeros(upper.shape[1], dtype=x.dtype)
    reg_upper[at.diagonal()] = reg
    matrices = torch.zeros(len(targets), d * d, dtype=x.dtype)  # the lower triangles stay 0
    active = torch.arange(len(targets))
    for _ in range(iterations):
        th = theta[active]
        p = torch.sigmoid(th @ xb.T)  # (problem, sample)
        grad = (p - targets[active]) @ xb + th * reg
        half = (p * (1 - p)) @ outer
        half += reg_upper
        hess = matrices[:len(active)]
        hess[:, flat] = half
        hess = hess.view(len(active), d, d)  # (problem, dim + 1, dim + 1), the upper triangle
        factor, info = torch.linalg.cholesky_ex(hess, upper=True)
        if bool(info.any()):  # not positive definite to rounding (saturated weights): the LU solve of the matrix
            full = torch.triu(hess) + torch.triu(hess, 1).transpose(-1, -2)
            step = torch.linalg.solve(full, grad.unsqueeze(-1)).squeeze(-1)
        else:
            half_step = torch.linalg.solve_triangular(factor.mT, grad.unsqueeze(-1), upper=False)
            step = torch.linalg.solve_triangular(factor, half_step, upper=True).squeeze(-1)
        theta[active] = th - step
        active = active[step.abs().amax(dim=1) >= tol]
        if not len(active):
            break
    return theta


def _fit_logistic_samples(x, targets, *, c: float = 1.0, iterations: int = 30, tol: float = 1e-9):
    """:func:`fit_logistic` of one design with fewer samples than dimensions (the demo's [CLS] state: 156 x 384):
    the same Newton steps, each solved in the samples' space.

    The step solves ``[A, X^T W 1; 1^T W X, 1^T W 1 + e] [dw; db] = [g_w; g_b]`` with ``A = X^T W X + I / c``
    (``W`` the weights ``p (1 - p)``, ``e`` :data:`INTERCEPT_RIDGE`). By the Woodbury identity,
    ``A^-1 v = c v - c^2 X^T S M^-1 S X v`` with ``S = W^(1/2)`` and ``M = I + c S X X^T S`` (sample x sample,
    its eigenvalues at least 1: Cholesky never fails, and no weight is divided by); the intercept's step is then its
    Schur complement's. A problem of ``n`` samples and ``d`` dimensions costs ``n^2 d + n^3 / 3`` a step instead of
    ``n d^2 + d^3 / 3``. The same coefficients as :func:`fit_logistic_designs` to 1e-15 (its speed: bench/HISTORY.md,
    2026-12-07 night).

    Parameters
    ----------
    x : torch.Tensor, shape (sample, dim)
        float64 design (standardised), ``sample < dim``.
    targets : torch.Tensor, shape (problem, sample)
        0/1 targets.

    Returns
    -------
    torch.Tensor, shape (problem, dim + 1)
        Coefficients, the intercept last.
    """
    import torch

    n = x.shape[0]
    w = torch.zeros(targets.shape[0], x.shape[1], dtype=x.dtype)
    b = torch.zeros(targets.shape[0], dtype=x.dtype)
    gram = x @ x.T  # (sample, sample), once
    eye = torch.eye(n, dtype=x.dtype)
    for _ in range(iterations):
        p = torch.sigmoid(w @ x.T + b[:, None])  # (problem, sample)
        residual = p - targets
        grad_w, grad_b = residual @ x + w / c, residual.sum(-1) + INTERCEPT_RIDGE * b
        weight = p * (1 - p)
        root = weight.sqrt()
        factor = torch.linalg.cholesky(eye + c * root[:, :, None] * gram * root[:, None, :])
        cross = weight @ x  # (problem, dim): X^T W 1
        both = torch.stack([grad_w, cross], dim=1)  # A^-1 of both, (problem, 2, dim)
        inner = torch.cholesky_solve((root[:, None, :] * (both @ x.T)).transpose(1, 2), factor).transpose(1, 2)
        solved = c * both - c * c * ((root[:, None, :] * inner) @ x)
        on_grad, on_cross = solved[:, 0], solved[:, 1]
        schur = weight.sum(-1) + INTERCEPT_RIDGE - (cross * on_cross).sum(-1)  # the intercept's Schur complement
        step_b = (grad_b - (cross * on_grad).sum(-1)) / schur
        step_w = on_grad - on_cross * step_b[:, None]
        w, b = w - step_w, b - step_b
        if max(float(step_w.abs().max()), float(step_b.abs().max())) < tol:
            break
    return torch.cat([w, b[:, None]], dim=-1)


def fit_logistic_designs(x, targets, *, c: float = 1.0, iterations: int = 30, tol: float = 1e-9):
    """:func:`fit_logistic` for several designs at once: every problem of ``targets`` on every design of ``x``.

    For small fits (a decoder's probes: 37 samples x 65 dimensions, 4 problems a head) one head's fit is little
    arithmetic under much Python and dispatch; the heads' Newton steps taken together are a few batched products.
    Each (design, problem) Hessian is formed from a weighted copy of its design and solved by its Cholesky factor;
    the steps stop when no coefficient of any problem moves more than ``tol``.

    Parameters
    ----------
    x : torch.Tensor, shape (design, sample, dim)
        float64 designs (standardised).
    targets : torch.Tensor, shape (problem, sample)
        0/1 targets, shared by the designs.

    Returns
    -------
    torch.Tensor, shape (design, problem, dim + 1)
    """
    import torch

    xb = torch.cat([x, torch.ones(*x.shape[:-1], 1, dtype=x.dtype)], dim=-1)  # (design, sample, dim + 1)
    d = xb.shape[-1]
    theta = torch.zeros(xb.shape[0], targets.shape[0], d, dtype=x.dtype)
    reg = torch.full((d,), 1.0 / c, dtype=x.dtype)
    reg[-1] = INTERCEPT_RIDGE
    ridge = torch.diag(reg)
    for _ in range(iterations):
        p = torch.sigmoid(theta @ xb.transpose(1, 2))  # (design, problem, sample)
        grad = (p - targets) @ xb + theta * reg
        weighted = (p * (1 - p)).unsqueeze(-1) * xb.unsqueeze(1)  # (design, problem, sample, dim + 1)
        hess = weighted.transpose(-1, -2) @ xb.unsqueeze(1) + ridge
        factor, info = torch.linalg.cholesky_ex(hess)
        if bool(info.any()):  # not positive definite to rounding (saturated weights): LU
            step = torch.linalg.solve(hess, grad.unsqueeze(-1)).squeeze(-1)
        else:
            step = torch.cholesky_solve(grad.unsqueeze(-1), factor).squeeze(-1)
        theta = theta - step
        if float(step.abs().max()) < tol:
            break
    return theta


def predict_logistic(x, theta, n_classes: int):
    """Class predictions of :func:`fit_logistic`'s coefficients.

    Parameters
    ----------
    x : torch.Tensor, shape ([design,] sample, dim)
    theta : torch.Tensor, shape ([design,] label set, problem, dim + 1)
        One problem for two classes (class 1 against 0); one per class (one-vs-rest) for more.
    n_classes

    Returns
    -------
    torch.Tensor of int64, shape ([design,] label set, sample)
    """
    import torch

    xb = torch.cat([x, torch.ones(*x.shape[:-1], 1, dtype=x.dtype)], dim=-1)
    scores = theta @ xb.transpose(-1, -2).unsqueeze(-3)  # ([design,] label set, problem, sample)
    if n_classes == 2:
        return (scores[..., 0, :] > 0).long()
    return scores.argmax(dim=-2)


def _one_vs_rest(codes, n_classes: int):
    """(label set, sample) class codes -> (label set, problem, sample) 0/1 targets."""
    import torch

    if n_classes == 2:
        return codes.unsqueeze(1).double()
    return (codes.unsqueeze(1) == torch.arange(n_classes).view(1, -1, 1)).double()


def _fit_predict(x_train, codes_train, x_test, n_classes: int):
    """Fit every label set of ``codes_train`` on ``x_train`` ((sample, dim), or (design, sample, dim): each design
    on its own; standardised here); predict train and test (``([design,] label set, sample)``)."""
    import torch

    mean, std = x_train.mean(dim=-2, keepdim=True), x_train.std(dim=-2, unbiased=False, keepdim=True)
    std = torch.where(std > 0, std, torch.ones_like(std))
    xtr, xte = (x_train - mean) / std, (x_test - mean) / std
    targets = _one_vs_rest(codes_train, n_classes)
    sets, problems, n = targets.shape
    theta = fit_logistic(xtr, targets.reshape(sets * problems, n))
    theta = theta.reshape(*theta.shape[:-2], sets, problems, -1)
    return predict_logistic(xtr, theta, n_classes), predict_logistic(xte, theta, n_classes)


def designs_per_fit(problems: int, samples: int, dim: int, heads: int, threads: int) -> int:
    """How many heads' designs :func:`_fit_predict` fits together: one where a head's problems outnumber its
    dimensions (:func:`fit_logistic` forms each Hessian from the samples' outer products, a head at a time); else as
    many as keep the weighted copies and Hessians of a batch near 64 MB, and at least two batches a thread."""
    d = dim + 1
    if problems >= d:
        return 1
    fits = max(1, int(64 * 2**20 // (problems * d * max(d, samples) * 8)))
    return max(1, min(fits, -(-heads // (2 * max(threads, 1)))))


def probe_fold_ids(codes: np.ndarray, groups: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, int]:
    """Cross-validation folds that keep each example's features together, stratified over examples.

    Parameters
    ----------
    codes : numpy.ndarray of int, shape (feature,)
        Class codes (one per feature; all features of an example share it).
    groups : numpy.ndarray of int, shape (feature,)
        Example of each feature.
    seed
        Shuffling seed of ``StratifiedKFold``.

    Returns
    -------
    fold : numpy.ndarray of int, shape (feature,)
        The test fold of each feature.
    n_folds : int
        ``min(5, examples of the rarest class)``; below 2 there are no folds (``fold`` is all -1).
    """
    from sklearn.model_selection import StratifiedKFold

    _, ex = np.unique(groups, return_inverse=True)
    per_example = np.asarray(codes)[np.unique(ex, return_index=True)[1]]
    counts = np.bincount(per_example)
    n_folds = int(min(MAX_FOLDS, counts[counts > 0].min())) if (counts > 0).sum() > 1 else 0
    fold = np.full(len(codes), -1, dtype=np.int64)
    if n_folds < 2:
        return fold, n_folds
    ex_fold = np.empty(len(per_example), dtype=np.int64)
    splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    for f, (_, test) in enumerate(splitter.split(np.zeros(len(per_example)), per_example)):
        ex_fold[test] = f
    return ex_fold[ex], n_folds


def permuted_labels(codes: np.ndarray, groups: np.ndarray, fold: np.ndarray, permutations: int, *,
                    seed: int = 0) -> np.ndarray:
    """Label sets for the permutation null: whole examples' labels shuffled among the examples of the same fold.

    Shuffling within folds keeps each fold's class counts, so a permuted fit sees the same stratified folds as the
    real one. Shuffling across folds would unbalance them, which pushes a chance-level probe *below* the
    majority baseline and makes the null too easy to beat.

    Parameters
    ----------
    codes, groups, fold : numpy.ndarray of int, shape (feature,)
        Class, example and fold of each feature (an example's features share all three).
    permutations
        Label sets to draw.
    seed
        Seed of the shuffles.

    Returns
    -------
    numpy.ndarray of int, shape (permutation, feature)
    """
    rng = np.random.default_rng(seed)
    _, ex = np.unique(groups, return_inverse=True)
    first = np.unique(ex, return_index=True)[1]
    ex_codes, ex_fold = codes[first], fold[first]
    members = [np.flatnonzero(ex_fold == f) for f in np.unique(ex_fold)]
    out = np.empty((permutations, len(codes)), dtype=np.asarray(codes).dtype)
    for i in range(permutations):
        shuffled = ex_codes.copy()
        for m in members:
            shuffled[m] = ex_codes[rng.permutation(m)]
        out[i] = shuffled[ex]
    return out


def permutation_p_values(observed: np.ndarray, permuted: np.ndarray, *, null: str = "pooled") -> np.ndarray:
    """One-sided permutation p-values of each head's score.

    Parameters
    ----------
    observed : numpy.ndarray, shape (head,)
        Each head's score on the true labels.
    permuted : numpy.ndarray, shape (head, permutation)
        Its scores on permuted labels.
    null
        ``per_head``: ``(1 + #{own permuted >= observed}) / (1 + permutations)``; ``pooled``: the same count over
        every head's permuted scores, ``/ (1 + heads x permutations)``.

    Returns
    -------
    numpy.ndarray, shape (head,)
    """
    if null == "per_head":
        return (1 + (permuted >= observed[:, None]).sum(axis=1)) / (1 + permuted.shape[1])
    if null != "pooled":
        raise ValueError(f"null={null!r}: expected 'pooled' or 'per_head'")
    pool = np.sort(permuted.ravel())
    return (1 + pool.size - np.searchsorted(pool, observed, side="left")) / (1 + pool.size)
