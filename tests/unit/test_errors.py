"""CodedError: one type with a stable code and a message, whatever part of the project raised it."""

import pickle

import pytest

from embedstream.errors import CodedError
from embedstream.schemas.events import ErrorInfo


class _FixedCode(CodedError, ValueError):
    code = "fixed"

    def __init__(self, message: str, detail: int):
        super().__init__(self.code, message)
        self.detail = detail


def test_str_is_the_message_and_code_is_kept():
    error = CodedError("too_long", "600 tokens, limit 256")
    assert str(error) == "600 tokens, limit 256"
    assert error.code == "too_long" and error.message == "600 tokens, limit 256"
    assert "too_long" in repr(error)


def test_to_info_and_error_info_carry_both_fields():
    error = CodedError("invalid_event", "missing doc_id")
    assert error.to_info() == {"code": "invalid_event", "message": "missing doc_id"}
    assert error.to_error_info() == ErrorInfo(code="invalid_event", message="missing doc_id")


def test_subclass_with_other_arguments_survives_pickling():
    error = _FixedCode("bad value", detail=7)
    with pytest.raises(ValueError):
        raise error
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is _FixedCode
    assert (copy.code, copy.message, copy.detail, str(copy)) == ("fixed", "bad value", 7, "bad value")
