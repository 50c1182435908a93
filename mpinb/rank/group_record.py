"""The default process group ``mpinb.torch.init_process_group`` made on this rank, as it describes it: written by
``process_group.py``, read by the tracing of torch's collectives (``trace_torch.py``) for the device a stand-in's
tensors go to. It imports nothing, so both can import it."""

_description = {}


def remember(**description):
    """Record the group just made: ``backend``, ``rank``, ``size``, ``local_rank``, ``device``, ``note``."""
    _description.clear()
    _description.update(description)


def forget():
    """The group is gone."""
    _description.clear()


def described():
    """A copy of the recorded description, or ``None`` when mpinb made no group that still stands."""
    return dict(_description) if _description else None


def bound_device():
    """The device ``init_process_group`` bound this rank to (``"cuda:1"``, ``"cpu"``), or ``None`` before."""
    return _description.get("device")
