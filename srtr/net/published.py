"""Read the node count an autoscaled pool's instance 0 publishes (docs/recipe.md, "Autoscaled
pools").

`GET http://<node IP>:<port><path>` from the controller (as scrapes and the fleet poll do),
or a file on a filesystem the controller sees. A publisher that is not up yet, slow, or
answering nonsense is no error of the job: the read says why and the pool keeps its size.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from srtr.resources.counts import parse_count

MAX_BODY = 4096  # a count, or a small JSON object: more is not a count


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        body: bytes = answer.read(MAX_BODY)
        return body.decode("utf-8", errors="replace")


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read(MAX_BODY)


async def read_count(where: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
    """(the published count, what was seen) at `where` (a URL or an absolute path); None
    with the reason when there is no count to read."""
    try:
        if where.startswith("http://"):
            work = asyncio.to_thread(_get, where, timeout)
        else:
            work = asyncio.to_thread(_read, where)
        text = await asyncio.wait_for(work, timeout + 1)
        count = parse_count(text)
    except TimeoutError:
        return None, f"{where}: no answer within {timeout:g}s"
    except urllib.error.HTTPError as exc:
        return None, f"{where} -> {exc.code}"
    except urllib.error.URLError as exc:
        return None, f"{where}: {exc.reason}"
    except OSError as exc:
        return None, f"{where}: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{where}: {exc}"
    return count, f"{where}: {count}"
