"""A multipart/form-data body (an OpenAI audio upload) read into its fields, in memory.

Starlette's form parser needs the `python-multipart` package and spools large files to a
temporary file on disk; an upload's audio must never touch disk, and the body is already
bounded by `skulk.api.body_guard` before it gets here, so the standard library's MIME
parser reads it from memory instead. Pure: bytes in, fields out; a malformed form is a
typed 400 (`InvalidRequest`, code `invalid_form`).
"""

from __future__ import annotations

from dataclasses import dataclass
from email import policy
from email.parser import BytesParser

from skulk.api.errors import InvalidRequest

MAX_FORM_FIELDS = 64
"""More parts than any audio request has (a file and about ten options): a form with more
is refused rather than walked."""


@dataclass(frozen=True)
class FormPart:
    """One field of the form: a text value, or a file (`filename` set) as bytes."""

    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None

    @property
    def text(self) -> str:
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"the form field {self.name!r} is not UTF-8 text", param=self.name,
                                 code="invalid_form") from None


def parse_form(content_type: str | None, body: bytes) -> dict[str, list[FormPart]]:
    """The parts of a multipart/form-data `body`, by field name, in order."""
    if not content_type or not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest("this route takes a multipart/form-data upload (a 'file' and the options as form "
                             "fields), as OpenAI's SDKs send it", code="invalid_form")
    if "boundary=" not in content_type:
        raise InvalidRequest("the multipart/form-data Content-Type names no boundary", code="invalid_form")
    header = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=policy.HTTP).parsebytes(header + body)
    if not message.is_multipart() or message.defects:
        raise InvalidRequest("the multipart/form-data body is malformed", code="invalid_form")
    fields: dict[str, list[FormPart]] = {}
    for count, part in enumerate(message.iter_parts(), start=1):
        if count > MAX_FORM_FIELDS:
            raise InvalidRequest(f"the form has more than {MAX_FORM_FIELDS} fields", code="invalid_form")
        if part.get_content_disposition() != "form-data":
            raise InvalidRequest("a part of the form is not form-data", code="invalid_form")
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("a part of the form has no field name", code="invalid_form")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        fields.setdefault(name, []).append(FormPart(name=name, data=data, filename=filename,
                                                    content_type=part.get_content_type() if filename else None))
    return fields


__all__ = ["MAX_FORM_FIELDS", "FormPart", "parse_form"]
