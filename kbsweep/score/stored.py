"""The stored (JSON) form shared by the records that carry an outcome and per-shape scores: a grade's
:class:`~kbsweep.grader.result.GradeResult` and a cell's :class:`~kbsweep.tracking.cell_result.CellResult`. Each names the
keys it writes; a stored record's keys this version does not know ride along in ``extra``, written back last."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Dict, Protocol, Sequence, Type, TypeVar

from kbsweep.outcomes import Outcome
from kbsweep.score.roofline import ShapeScore

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    class StoredRecord(DataclassInstance, Protocol):
        """A record dataclass with ``outcome``, ``shapes`` and ``extra`` among its fields."""

        def __init__(self, **values: Any) -> None: ...


R = TypeVar("R", bound="StoredRecord")


def to_stored(record: Any, keys: Sequence[str]) -> Dict[str, Any]:
    """``keys`` of ``record`` in that order, its shapes and outcome as JSON, then its ``extra`` keys."""
    out = {key: getattr(record, key) for key in keys}
    if "shapes" in out:
        out["shapes"] = [shape.to_json() for shape in record.shapes]
    return {**out, "outcome": record.outcome.value, **record.extra}


def from_stored(cls: Type[R], data: Dict[str, Any], always: Sequence[str] = ()) -> R:
    """The record ``cls`` of stored ``data``; of the keys it lacks, those in ``always`` read as None, the rest take
    their defaults."""
    known = {f.name for f in fields(cls)} - {"extra"}
    values = {key: data.get(key) for key in always}
    values.update({key: value for key, value in data.items() if key in known and key not in always})
    values.update(
        outcome=Outcome(data["outcome"]), shapes=[ShapeScore.from_json(shape) for shape in data.get("shapes") or []]
    )
    return cls(**values, extra={key: value for key, value in data.items() if key not in known})
