"""Personal data out of recordings before they leave the machine (Qt-free).

    patterns   text recognizers: e-mail, phone, payment card (Luhn), IBAN (mod 97), IP address,
               API keys and tokens
    ocr        the OCR engine (RapidOCR's PP-OCR models, shipped inside its PyPI package), loaded lazily
    frames     personal data on a screenshot: OCR lines -> recognizer spans -> boxes; blurring
    plan       what will be blurred or masked and who decided it, kept in episode.meta['redaction']
    review     scanning an episode, approving its plan, and the redacted view that is uploaded

Importing this package loads nothing heavy: the OCR engine starts on the first frame it reads.
"""
from __future__ import annotations

from agent.errors import TandemError


class RedactionError(TandemError):
    """Redaction could not be done as asked; the message says what and with which value."""
