"""``DistributedSampler`` without ``set_epoch``: every epoch would see the same order, said the moment it happens.

A shuffling ``DistributedSampler`` draws its order from ``seed + epoch``; unless ``set_epoch(epoch)`` is called at
the start of each epoch, every epoch shuffles the same way. Its ``__iter__`` is wrapped (once
``torch.utils.data.distributed`` is imported) to say so, once per sampler, the second time it is iterated with an
epoch it was already iterated with.
"""

import functools
import sys
import weakref

_epochs = weakref.WeakKeyDictionary()  # sampler -> the epochs it was iterated with
_done = False


def install(module):
    """Wrap *module*'s (``torch.utils.data.distributed``'s) ``DistributedSampler.__iter__`` (idempotent)."""
    global _done
    if _done:
        return
    _done = True
    sampler = module.DistributedSampler
    iterate = sampler.__iter__

    @functools.wraps(iterate)
    def __iter__(self):
        if getattr(self, "shuffle", False):
            note(self)
        return iterate(self)

    sampler.__iter__ = __iter__


def note(sampler):
    """*sampler* is iterated now: say so if its epoch is one it was iterated with before."""
    try:
        seen = _epochs.setdefault(sampler, set())
    except TypeError:  # not weakly referable or not hashable: nothing to remember it by
        return
    epoch = getattr(sampler, "epoch", None)
    if epoch in seen and None not in seen:
        seen.add(None)  # said once per sampler
        print(f"[mpinb] this DistributedSampler is iterated again with epoch {epoch}, so it deals the same "
              "order as before: call sampler.set_epoch(epoch) at the start of each epoch", file=sys.stderr)
    seen.add(epoch)
