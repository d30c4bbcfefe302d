"""Exceptions: every failure the daemon reports carries its status code
(a grpc.StatusCode) and message, the same whether the call went through
gRPC or the command ring."""

import grpc

__all__ = [
    "EvokeError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Unavailable",
    "DeadlineExceeded",
    "DataLoss",
    "error_for",
]


class EvokeError(Exception):
    """A call evoked refused or that could not complete.

    Attributes:
      code: the grpc.StatusCode.
      message: the daemon's message (it names the field for bad input).
    """

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self):
        return f"{self.code.name}: {self.message}"


class InvalidArgument(EvokeError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(EvokeError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(EvokeError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(EvokeError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(EvokeError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(EvokeError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(EvokeError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(EvokeError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(EvokeError):
    code = grpc.StatusCode.DATA_LOSS


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, AlreadyExists,
                                      PermissionDenied, ResourceExhausted,
                                      FailedPrecondition, Unavailable,
                                      DeadlineExceeded, DataLoss)}
# absl::StatusCode numbers (the ring's completions) are gRPC's.
_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def error_for(code, message):
    """The exception for a status `code` (grpc.StatusCode or its number)."""
    if isinstance(code, int):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(code, EvokeError)
    return cls(message, code)


def from_rpc_error(e):
    """The EvokeError for a grpc.RpcError."""
    try:
        return error_for(e.code(), e.details() or "")
    except AttributeError:  # pragma: no cover - not a call error
        return EvokeError(str(e))
