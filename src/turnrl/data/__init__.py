"""The data model and its files (DESIGN 2.2): trajectories and preference pairs as JSONL.

- :mod:`turnrl.data.schema`: the dataclasses :class:`Message`, :class:`Trajectory`,
  :class:`Pair` and the schema tags;
- :mod:`turnrl.data.io`: validating readers (``FILE:LINE: what is wrong``), the
  append-only :class:`JsonlWriter`, atomic :func:`write_jsonl`, :func:`summarize`;
- :mod:`turnrl.data.eto`: import of ETO's ``{"id", "conversations"}`` files.
"""

from turnrl.data.eto import convert_eto, eto_item_to_trajectory, import_eto, parse_action
from turnrl.data.io import (
    SCHEMAS,
    JsonlWriter,
    iter_jsonl,
    iter_pairs,
    iter_records,
    iter_trajectories,
    pair_from_dict,
    read_pairs,
    read_records,
    read_trajectories,
    record_from_dict,
    summarize,
    trajectory_from_dict,
    write_jsonl,
)
from turnrl.data.schema import PAIR_SCHEMA, ROLES, SOURCES, TRAJECTORY_SCHEMA, Message, Pair, Role, Trajectory

__all__ = [
    "PAIR_SCHEMA",
    "ROLES",
    "SCHEMAS",
    "SOURCES",
    "TRAJECTORY_SCHEMA",
    "JsonlWriter",
    "Message",
    "Pair",
    "Role",
    "Trajectory",
    "convert_eto",
    "eto_item_to_trajectory",
    "import_eto",
    "iter_jsonl",
    "iter_pairs",
    "iter_records",
    "iter_trajectories",
    "pair_from_dict",
    "parse_action",
    "read_pairs",
    "read_records",
    "read_trajectories",
    "record_from_dict",
    "summarize",
    "trajectory_from_dict",
    "write_jsonl",
]
