"""What to do about a mismatch the roll call proved: the fix for the classic data-parallel bugs, in one sentence.

Each rule looks at one mismatch (the collective's communicator and what each member did at its number: ``in``
it with a signature, ``finished`` the cell without entering it, ...) and names the bug it shows with its fix.
"""


def advice(comm, entries):
    """One sentence for the mismatch at one collective of *comm* (``{rank: (kind, signature)}``), or ``""``."""
    signatures = [signature for kind, signature in entries.values() if kind == "in" and signature]
    finished = sorted(rank for rank, (kind, _) in entries.items() if kind == "finished")
    ddp = any(signature[0].startswith("DDP ") for signature in signatures)
    if finished and ddp:
        who = "rank" if len(finished) == 1 else "ranks"
        return (f"uneven inputs: {who} {', '.join(map(str, finished))} ran out of batches first and stopped "
                "taking part in the gradient all_reduce; give every rank as many batches "
                "(DistributedSampler(dataset, drop_last=True), or stop all ranks at the shortest), or train inside "
                "`with model.join():`, where the ranks that finished shadow the others' all_reduce")
    if finished and comm.startswith("torch:"):
        return ("a rank left before a collective the others wait in: every rank must make the same "
                "torch.distributed calls (the same number of steps, no rank-dependent collective)")
    ops = {signature[0] for signature in signatures}
    if len(ops) > 1 or len({signature[1] for signature in signatures}) > 1:
        return ("the ranks call collectives in a different order (or with a different root): every rank must "
                "make the same calls in the same order")
    if len({(signature[2], signature[3]) for signature in signatures}) > 1:
        return ("the ranks passed tensors of different sizes or types to the same collective: every rank must pass "
                "the same shape and dtype (pad, or all_gather the sizes first)")
    return ""
