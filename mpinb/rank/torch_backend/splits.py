"""A flat tensor's parts, one per rank: spread into a call's output tensors, and counted from
``all_to_all_single``'s splits."""


def spread(joined, outputs):
    """Copy the parts of the flat *joined* into *outputs*, one after another."""
    offset = 0
    for output in outputs:
        n = output.numel()
        output.detach().copy_(joined[offset:offset + n].view(output.shape))
        offset += n


def split_counts(splits, tensor, size, per_row):
    """Elements to or from each rank for ``all_to_all_single``: *splits* are rows (first-dimension slices); none
    means equal parts."""
    if not splits:
        return [tensor.numel() // size] * size
    return [int(rows) * per_row for rows in splits]
