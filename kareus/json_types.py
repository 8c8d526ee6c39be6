"""Types of JSON values, for records whose shape must stay a plain dict on disk (a phase record
of the device check, a report): what :func:`json.dumps` writes and :func:`json.loads` reads.

Records that travel between modules are frozen dataclasses with ``to_dict``; these aliases type
the dicts those methods return and the few free-form documents built in place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypeAlias, TypeVar

#: One JSON value, as written: ``Json`` is recursive, its arrays any sequence (a tuple is written
#: as a list) and its objects any mapping with string keys (read-only views, so that a
#: ``list[int]`` or a ``dict[str, float]`` is one).
Json: TypeAlias = "None | bool | int | float | str | Sequence[Json] | Mapping[str, Json]"

#: A JSON object being built (its values any JSON).
JsonObject: TypeAlias = "dict[str, Json]"


T = TypeVar("T")


def is_finite_number(v: object) -> bool:
    """Whether a value read from JSON is a finite number (``true`` and ``false`` are not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def construct(cls: type[T], fields: Mapping[str, object]) -> T:
    """``cls(**fields)``: a record from a JSON object whose names the constructor checks (an
    unknown one raises :class:`TypeError`) and whose values the record's own validation
    examines (e.g. ``__post_init__``, or a ``problem`` method called later) -- the one place a
    JSON object's values meet a constructor unchecked."""
    return cls(**fields)


def record_dict(record: object) -> JsonObject:
    """A record's fields as a JSON object, in declaration order (:func:`dataclasses.asdict`:
    nested records become objects too): the ``to_dict`` of a record written as it is."""
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"record_dict needs a dataclass instance, got {type(record).__name__}")
    out: JsonObject = dataclasses.asdict(record)
    return out
