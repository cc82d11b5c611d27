"""`generic`: launches exactly the recipe's argv."""

from __future__ import annotations

from srtr.resources.kinds.base import Kind, register

register(Kind(name="generic"))
