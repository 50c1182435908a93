"""Replicas that drifted apart: the models each rank fingerprinted after a cell (``rank/replicas.py``), compared.

Each difference is said once per model and kind, in one line with the tensors, the ranks and the likely fix.
"""

from ...wire.ranks import label_ranks


def differences(replies, said):
    """Lines for the models whose fingerprints in *replies* (``{rank: reply}``) differ across ranks; *said* (a
    set kept by the caller) holds what was said already, so each is said once."""
    models = {}
    for rank, reply in sorted(replies.items()):
        for label, prints in reply.replicas.items():
            models.setdefault(label, {})[rank] = prints
    lines = []
    for label, by_rank in sorted(models.items()):
        if len(by_rank) < 2:
            continue
        for kind in ("params", "buffers"):
            differ, groups = _differing(by_rank, kind)
            if not differ or (label, kind) in said:
                continue
            said.add((label, kind))
            shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
            apart = "; ".join(label_ranks(ranks) for ranks in groups)
            if kind == "params":
                lines.append(f"the parameters of `{label}` differ across ranks after this cell ({shown}: {apart} "
                             "each hold other values): a rank skipped the gradient all_reduce or the optimizer step, "
                             "or they were never broadcast from one rank (DDP broadcasts them when it wraps the "
                             "model; mpinb.torch.broadcast_parameters does it for a model trained without DDP)")
            elif any(prints.get("batchnorm") for prints in by_rank.values()):
                lines.append(f"the BatchNorm statistics of `{label}` differ across ranks ({shown}: {apart}): each "
                             "rank normalises with its own batch's mean and variance, and DDP overwrites the others' "
                             "with rank 0's at each forward; on GPUs "
                             "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), before wrapping it in DDP, "
                             "computes them across ranks (on CPU, average the running "
                             "statistics with dist.all_reduce after each step, or use GroupNorm)")
            else:
                lines.append(f"the buffers of `{label}` differ across ranks after this cell ({shown}: {apart})")
    return lines


def _differing(by_rank, kind):
    """The tensor names whose fingerprint is not the same on every rank, and the ranks grouped by what they hold."""
    names = sorted(set().union(*(prints[kind].keys() for prints in by_rank.values())))
    differ = [name for name in names if len({prints[kind].get(name) for prints in by_rank.values()}) > 1]
    if not differ:
        return [], []
    groups = {}
    for rank, prints in by_rank.items():
        groups.setdefault(tuple(prints[kind].get(name) for name in differ), []).append(rank)
    return differ, sorted(groups.values())
