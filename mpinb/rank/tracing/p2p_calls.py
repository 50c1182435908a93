"""The traced point-to-point methods: a blocking call noted while it blocks (for a roll call, which
:func:`stuck_p2p` reads back), a nonblocking one's request carrying the call for the wait that completes it, and
each recorded as a span while a cell is traced."""

from ...wire.kinds import PointToPoint
from . import comms, ledger
from .arguments import ARRAYS, KEYWORDS, TAGS, argument, describe, object_bytes, peer_rank, peer_text
from .calls import named_like, record_span
from .comms import ledger_of

_state = ledger.state
_now = ledger.now_ns
_registry = comms.registry
_arrays = ARRAYS


def point_to_point(base, name, spec):
    """mpi4py's blocking point-to-point call *name*, noted while it blocks (for :func:`stuck_p2p`)."""
    send_at, recv_at, peer_at, source_at = spec
    objects = name.islower()
    direction, tag_at = TAGS[name]

    def method(self, *args, **kwargs):
        start = _now()
        if _state.note_p2p:  # read only if the rank gets stuck
            _state.p2p = (self, name, direction, args, kwargs, spec, tag_at)
        value = None
        try:
            value = base(self, *args, **kwargs)
            return value
        finally:
            end = _now()
            _state.p2p = None
            _state.comm_ns += end - start
            if _state.spans is not None:
                _p2p_span(self, name, args, kwargs, spec, objects, value, start, end)

    return named_like(method, name, base)


def _p2p_span(comm, name, args, kwargs, spec, objects, value, start, end):
    send_at, recv_at, peer_at, source_at = spec
    send = argument(args, kwargs, send_at, KEYWORDS["send"])
    receive = argument(args, kwargs, recv_at, KEYWORDS["recv"])
    names = KEYWORDS["source"] if name in ("Recv", "recv", "Probe", "probe") else KEYWORDS["peer"]
    peer = argument(args, kwargs, peer_at, names)
    if objects:
        sent, received = object_bytes(send), object_bytes(value)
    else:
        sent = describe(send)[2]
        received = describe(receive)[2]
    detail = ""
    if source_at is not None:
        source = argument(args, kwargs, source_at, KEYWORDS["source"])
        detail = f"from {peer_text(source)}"
    record_span(name, ledger_of(comm).name, peer_rank(peer), sent, received, start, end, None, "p2p", detail)


def stuck_p2p():
    """The blocking point-to-point call the main thread is in, described for the notebook
    (:class:`~mpinb.wire.kinds.PointToPoint`), or ``None``."""
    current = _state.p2p
    if current is None:
        return None
    comm, name, direction, args, kwargs, spec, tag_at = current
    send_at, recv_at, peer_at, source_at = spec
    tag = argument(args, kwargs, tag_at, ("tag", "sendtag"))
    tag = 0 if tag is None else tag
    sends = receives = None
    if direction in ("send", "both"):
        dest = argument(args, kwargs, peer_at, KEYWORDS["peer"])
        data = argument(args, kwargs, send_at, KEYWORDS["send"])
        sends = (dest, tag, None if name.islower() else describe(data)[2])
    if direction in ("recv", "both"):
        at = peer_at if direction == "recv" else source_at
        source = argument(args, kwargs, at, KEYWORDS["source"])
        receive_tag = tag if direction == "recv" else argument(args, kwargs, 5, ("recvtag",))
        data = argument(args, kwargs, recv_at, KEYWORDS["recv"]) if recv_at is not None else None
        receives = (-1 if source is None else source, -1 if receive_tag is None else receive_tag,
                    None if name.islower() or data is None else describe(data)[2])
    return PointToPoint(ledger_of(comm).name, name, sends, receives)


def nonblocking_p2p(base, name, spec):
    """mpi4py's nonblocking point-to-point call *name*: its request carries the call for the wait."""
    send_at, recv_at, peer_at = spec
    objects = name.islower()
    receiving = "ecv" in name

    def method(self, *args, **kwargs):
        start = _now()
        if kwargs:
            made = base(self, *args, **kwargs)
        elif len(args) == 3:  # Isend(buffer, dest, tag): the call itself, not a tuple and a dict built for it
            made = base(self, args[0], args[1], args[2])
        else:
            made = base(self, *args)
        request = _registry.installed["request"](made)  # traced_request, in place
        request._mpinb_original = made
        end = _now()
        try:
            info = self._mpinb
        except AttributeError:
            info = ledger_of(self)
        if kwargs:
            peer = argument(args, kwargs, peer_at, KEYWORDS["source" if receiving else "peer"])
        else:
            peer = args[peer_at] if peer_at < len(args) else None
        if peer is not None and peer < 0:  # ANY_SOURCE, PROC_NULL
            peer = None
        sent = received = 0
        spans = _state.spans
        if spans is not None:
            if kwargs:
                send = argument(args, kwargs, send_at, KEYWORDS["send"])
                receive = argument(args, kwargs, recv_at, KEYWORDS["recv"])
            else:
                n = len(args)
                send = args[send_at] if send_at is not None and send_at < n else None
                receive = args[recv_at] if recv_at is not None and recv_at < n else None
            if objects:
                sent = object_bytes(send)
            else:  # describe(...)[2], with numpy's arrays read in place
                sent = send.nbytes if type(send) in _arrays else describe(send)[2]
                received = receive.nbytes if type(receive) in _arrays else describe(receive)[2]
            spans.append((name, info.name, peer, sent, received, start, end, None, "p2p", ""))  # record_span
            _state.recorded += 1
        request._mpinb = (name, info, peer, sent, received, None, None, "")
        return request

    return named_like(method, name, base)
