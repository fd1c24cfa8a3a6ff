"""The exceptions of the aker client.

Every exception the client raises is an :class:`AkerError`. A reply whose ``status`` is not
``OK`` raises the :class:`StatusError` subclass for that status (one class per status of
PROTOCOL.md, "Errors"); the same class is raised, with ``local = True``, when the client
itself refuses a request before sending it (a wrong dimension, a NaN, a k above ``k_max``,
a frame over ``max_frame_bytes``), so a caller catches one class whichever end noticed.

::

    AkerError
    ├── StatusError                      a status reply (or the client's own check)
    │   ├── NotFound                     1  NOT_FOUND
    │   ├── Busy                         2  BUSY
    │   ├── TooLarge (ValueError)        3  TOO_LARGE
    │   ├── BadFrame                     4  BAD_FRAME
    │   ├── BadVersion                   5  BAD_VERSION
    │   ├── UnknownOp                    6  UNKNOWN_OP
    │   ├── InvalidRequest (ValueError)  7  BAD_REQUEST
    │   │   ├── DimensionMismatch        8  DIM_MISMATCH
    │   │   ├── NonFinite                9  NON_FINITE
    │   │   ├── BadK                     10 BAD_K
    │   │   └── UnknownCollection        12 UNKNOWN_COLLECTION
    │   ├── DeadlineExceeded             11 DEADLINE_EXCEEDED
    │   ├── Unsupported                  13 UNSUPPORTED
    │   ├── Unavailable                  14 UNAVAILABLE
    │   ├── ShuttingDown                 15 SHUTTING_DOWN
    │   ├── InternalError                16 INTERNAL
    │   └── Unauthenticated (AuthError)  17 UNAUTHENTICATED
    ├── AuthError
    │   ├── AuthRequired                 the server asks for AUTH, no secret was given
    │   ├── ServerNotAuthentic           a secret was given, the server did not prove it
    │   └── InvalidSecret (ValueError)   the secret is too short / too long / unreadable
    ├── AkerConnectionError (ConnectionError)
    │   ├── ConnectionClosed             the server closed the connection
    │   ├── TLSError                     the TLS handshake failed
    │   └── WriteInDoubt                 a Cluster write whose outcome is unknown (not retried)
    ├── Timeout (TimeoutError)           connect or request timeout of the client
    └── ProtocolError                    a reply that does not decode
        └── IncompatibleServer           no common version (2 to 6), or HELLO is not as expected
"""

from __future__ import annotations

from ._protocol import Status

__all__ = [
    "AkerError",
    "StatusError",
    "NotFound",
    "Busy",
    "TooLarge",
    "BadFrame",
    "BadVersion",
    "UnknownOp",
    "InvalidRequest",
    "DimensionMismatch",
    "NonFinite",
    "BadK",
    "DeadlineExceeded",
    "UnknownCollection",
    "Unsupported",
    "Unavailable",
    "ShuttingDown",
    "InternalError",
    "Unauthenticated",
    "AuthError",
    "AuthRequired",
    "ServerNotAuthentic",
    "InvalidSecret",
    "AkerConnectionError",
    "ConnectionClosed",
    "WriteInDoubt",
    "TLSError",
    "Timeout",
    "ProtocolError",
    "IncompatibleServer",
    "STATUS_ERRORS",
    "error_for_status",
]


class AkerError(Exception):
    """Base of every exception this package raises."""


class AuthError(AkerError):
    """Authentication (protocol version 3) failed or cannot be done."""


class StatusError(AkerError):
    """A reply with a non-``OK`` status, or the client's own refusal of a request.

    Attributes:
        status: the :class:`~aker.Status`, or ``None`` for a code this client does not know.
        code: the numeric status code.
        message: the server's message (or the client's).
        request_id: the id of the request answered (0: a connection-level reply).
        local: True when the client refused the request before sending anything.
        row: for an error of :meth:`~aker.Client.search_batch`, the index of the failed
            row of the matrix (for an error reply to a whole SEARCH_BATCH frame, the first
            row that frame carried); ``None`` otherwise.
    """

    #: The status this class stands for (``None`` on the base class).
    STATUS: Status | None = None

    def __init__(
        self,
        message: str = "",
        *,
        code: int | None = None,
        request_id: int = 0,
        local: bool = False,
    ) -> None:
        if code is None:
            code = int(self.STATUS) if self.STATUS is not None else -1
        self.code: int = code
        try:
            self.status: Status | None = Status(code)
        except ValueError:
            self.status = None
        self.message: str = message
        self.request_id: int = request_id
        self.local: bool = local
        self.row: int | None = None
        name = self.status.name if self.status is not None else f"status {code}"
        where = "client check" if local else "server"
        super().__init__(f"{name} ({where}): {message}" if message else f"{name} ({where})")


class NotFound(StatusError):
    """``NOT_FOUND`` (1): the id the request names is not present."""

    STATUS = Status.NOT_FOUND


class Busy(StatusError):
    """``BUSY`` (2): over a limit that clears by itself (``max_inflight``, a full queue, or,
    connection-level, ``max_connections``); retry later."""

    STATUS = Status.BUSY


class TooLarge(StatusError, ValueError):
    """``TOO_LARGE`` (3): the frame is over the server's ``max_frame_bytes``. The client
    refuses such a frame itself (``local``) so the connection survives the mistake."""

    STATUS = Status.TOO_LARGE


class BadFrame(StatusError):
    """``BAD_FRAME`` (4): the server did not read a frame (bad magic); it closed."""

    STATUS = Status.BAD_FRAME


class BadVersion(StatusError):
    """``BAD_VERSION`` (5): the server does not speak the request's version."""

    STATUS = Status.BAD_VERSION


class UnknownOp(StatusError):
    """``UNKNOWN_OP`` (6): the server does not know the opcode."""

    STATUS = Status.UNKNOWN_OP


class InvalidRequest(StatusError, ValueError):
    """``BAD_REQUEST`` (7): the request is malformed (also the base of the other
    bad-input statuses: dimension, finiteness, k, collection)."""

    STATUS = Status.BAD_REQUEST


class DimensionMismatch(InvalidRequest):
    """``DIM_MISMATCH`` (8): the vector's dimension is not the server's ``dim``."""

    STATUS = Status.DIM_MISMATCH


class NonFinite(InvalidRequest):
    """``NON_FINITE`` (9): a vector component or a FILL distance is NaN or infinite."""

    STATUS = Status.NON_FINITE


class BadK(InvalidRequest):
    """``BAD_K`` (10): k is 0 or above the server's ``k_max``."""

    STATUS = Status.BAD_K


class DeadlineExceeded(StatusError):
    """``DEADLINE_EXCEEDED`` (11): the request's deadline or the server's
    ``request_timeout_ms`` passed first; for INSERT / DELETE / FILL the outcome is unknown."""

    STATUS = Status.DEADLINE_EXCEEDED


class UnknownCollection(InvalidRequest):
    """``UNKNOWN_COLLECTION`` (12): the collection id is not served."""

    STATUS = Status.UNKNOWN_COLLECTION


class Unsupported(StatusError):
    """``UNSUPPORTED`` (13): not available in this server's configuration (e.g. FILL
    without a cache-aside backend, a payload the backend cannot keep)."""

    STATUS = Status.UNSUPPORTED


class Unavailable(StatusError):
    """``UNAVAILABLE`` (14): the backend failed or cannot be reached."""

    STATUS = Status.UNAVAILABLE


class ShuttingDown(StatusError):
    """``SHUTTING_DOWN`` (15): the server is stopping; it closed the connection."""

    STATUS = Status.SHUTTING_DOWN


class InternalError(StatusError):
    """``INTERNAL`` (16): a server bug."""

    STATUS = Status.INTERNAL


class Unauthenticated(StatusError, AuthError):
    """``UNAUTHENTICATED`` (17): the connection has not authenticated, or its AUTH proof
    did not hold (a wrong secret; the server then closes the connection)."""

    STATUS = Status.UNAUTHENTICATED


class AuthRequired(AuthError):
    """The server requires authentication and no secret was given."""


class ServerNotAuthentic(AuthError):
    """A secret was given but the server did not ask for AUTH (or speaks a version below
    3), or its proof did not hold: it cannot show it knows the secret."""


class InvalidSecret(AuthError, ValueError):
    """The secret is unusable: shorter than 16 bytes, longer than 4096, or unreadable."""


class AkerConnectionError(AkerError, ConnectionError):
    """The connection could not be made or is unusable.

    Attributes:
        not_sent: ``True`` when the request this error ended provably never left the
            client (:class:`~aker.AsyncClient`: its connection was found closed before
            it was written), so another node may take it; ``False`` when it may have.
    """

    not_sent: bool = False


class ConnectionClosed(AkerConnectionError):
    """The server closed the connection (or it was closed here)."""


class WriteInDoubt(AkerConnectionError):
    """A write (INSERT, DELETE) of :class:`~aker.Cluster` whose connection failed after the
    request may have reached the node (a timeout, a reset, a close once it was sent): the
    node may have executed it, or may still do so later. It is not sent to another node
    (INSERT is an upsert: a late commit on the first node could overwrite a newer value
    written through another); the caller decides (read it back, or write it again).
    ``__cause__`` is the connection error.

    Attributes:
        address: the node's address (``"host:port"``, as the cluster state names it).
        node_id: the node's id.
    """

    def __init__(self, message: str = "", *, address: str = "", node_id: int | None = None) -> None:
        super().__init__(message)
        self.address: str = address
        self.node_id: int | None = node_id


class TLSError(AkerConnectionError):
    """The TLS handshake failed: the server's certificate is not trusted, expired or not
    for the host name, the server refused this client's certificate (mutual TLS), or the
    server does not speak TLS on that port."""


class Timeout(AkerError, TimeoutError):
    """The client's own timeout (connect, or a request's reply) passed. After a request
    timed out the connection stays usable; a late reply is dropped. The request may
    still have been executed by the server.

    Attributes:
        not_sent: ``True`` when the request was never written (:class:`~aker.AsyncClient`:
            it was still waiting for a slot of the window when its time ran out).
    """

    not_sent: bool = False


class ProtocolError(AkerError):
    """A reply that does not decode, or answers something other than what was asked."""


class IncompatibleServer(ProtocolError):
    """The server speaks no common protocol version (this client needs 2, 3, 4, 5 or 6), or its
    HELLO is not what the client was told to expect (dimension, metric)."""


#: Status code → exception class, for every non-OK status of PROTOCOL.md.
STATUS_ERRORS: dict[Status, type[StatusError]] = {
    cls.STATUS: cls
    for cls in (
        NotFound,
        Busy,
        TooLarge,
        BadFrame,
        BadVersion,
        UnknownOp,
        InvalidRequest,
        DimensionMismatch,
        NonFinite,
        BadK,
        DeadlineExceeded,
        UnknownCollection,
        Unsupported,
        Unavailable,
        ShuttingDown,
        InternalError,
        Unauthenticated,
    )
    if cls.STATUS is not None
}


def error_for_status(
    code: int, message: str = "", *, request_id: int = 0, local: bool = False
) -> StatusError:
    """The exception for status ``code`` (a :class:`StatusError` for an unknown code)."""
    try:
        cls: type[StatusError] = STATUS_ERRORS[Status(code)]
    except (ValueError, KeyError):
        cls = StatusError
    return cls(message, code=code, request_id=request_id, local=local)
