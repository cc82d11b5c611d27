"""The fleet gate's poll: how many members a cluster's head sees alive (docs/recipe.md, "The
fleet gate").

The only fleet today is Ray's: the head dashboard's `GET /nodes?view=summary` lists one
entry per raylet, and a member counts once its raylet's state is `ALIVE`. A dashboard that
is down, slow or answers nonsense is not an error here: the gate keeps polling until its
timeout, so the poll returns None with the reason instead of raising.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any


def count_alive(body: bytes) -> int:
    """ALIVE raylets in a Ray dashboard node summary.

    Raises:
        ValueError: the body is not a node summary.
    """
    data: Any = json.loads(body)
    summary = data.get("data", {}).get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, list):
        raise ValueError("no data.summary list in the answer")
    return sum(
        1
        for node in summary
        if isinstance(node, dict)
        and isinstance(node.get("raylet"), dict)
        and node["raylet"].get("state") == "ALIVE"
    )


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        body: bytes = answer.read()
        return body


async def alive_members(url: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
    """(ALIVE members, what was seen) at `url`; None when it cannot say (the gate polls on)."""
    try:
        # urllib blocks; a thread keeps the controller's loop free while the head is slow.
        body = await asyncio.wait_for(asyncio.to_thread(_get, url, timeout), timeout + 1)
        alive = count_alive(body)
    except TimeoutError:
        return None, f"{url}: no answer within {timeout:g}s"
    except urllib.error.HTTPError as exc:
        return None, f"{url} -> {exc.code}"
    except urllib.error.URLError as exc:
        return None, f"{url}: {exc.reason}"
    except OSError as exc:
        return None, f"{url}: {exc.strerror or exc}"
    except ValueError as exc:  # JSONDecodeError is one
        return None, f"{url}: not a node summary ({exc})"
    return alive, f"{url}: {alive} ALIVE"
