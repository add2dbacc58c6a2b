"""kvattn's exceptions: one class per C++ error kind, each also the builtin exception that
FlashInfer users catch for that kind of mistake (ValueError for bad arguments, RuntimeError for
what cannot run here). The message is the C++ message: it names the argument, the value and the
rule."""

from . import _kvattn


class Error(Exception):
    """Base class of every error kvattn raises. ``code`` is the C++ error kind."""

    code = "unknown"


class InvalidArgumentError(Error, ValueError):
    """A value that breaks a rule of the API (DESIGN.md §4)."""

    code = "invalid_argument"


class InvalidShapeError(InvalidArgumentError):
    code = "invalid_shape"


class InvalidDTypeError(InvalidArgumentError, TypeError):
    code = "invalid_dtype"


class InvalidPageTableError(InvalidArgumentError):
    code = "invalid_page_table"


class OutOfBoundsError(InvalidArgumentError):
    code = "out_of_bounds"


class AliasingError(InvalidArgumentError):
    code = "aliasing"


class InvalidScaleError(InvalidArgumentError):
    code = "invalid_scale"


class SizeOverflowError(InvalidArgumentError, OverflowError):
    code = "overflow"


class ParseError(InvalidArgumentError):
    code = "parse_error"


class NotSupportedError(Error, ValueError, NotImplementedError):
    """The backend cannot run the problem (its capability declaration says why)."""

    code = "not_supported"


class UnavailableError(Error, RuntimeError):
    """The backend is not built, or its device is not on this machine."""

    code = "unavailable"


class IoError(Error, RuntimeError):
    code = "io_error"


class InternalError(Error, RuntimeError):
    """A bug in kvattn."""

    code = "internal"


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgumentError, InvalidShapeError, InvalidDTypeError, InvalidPageTableError,
                OutOfBoundsError, AliasingError, InvalidScaleError, SizeOverflowError, ParseError,
                NotSupportedError, UnavailableError, IoError, InternalError)
}
_kvattn._set_error_classes(_BY_CODE)
