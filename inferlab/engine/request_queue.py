"""The scheduler's waiting queue, in the order requests are admitted (vLLM's --scheduling-policy).

- "fcfs": by arrival; a preempted request goes back to the front, ahead of everything queued.
- "priority": by (priority, arrival time), lower first; a preempted request goes back by the
  same key, so it waits behind queued requests of a higher priority (a lower value).
Iteration yields the queue in admission order, without changing it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from inferlab.engine.request import Request

SCHEDULING_POLICIES = ("fcfs", "priority")


class FCFSQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def requeue(self, request: Request) -> None:
        """A preempted request: it goes first, so earlier victims end up in front."""
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request_ids: set[str]) -> None:
        self._queue = deque(r for r in self._queue if r.request_id not in request_ids)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue:
    def __init__(self) -> None:
        # (priority, arrival_time, push order, request): the push order breaks ties (n > 1
        # copies share an arrival time) and keeps requests themselves out of comparisons
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._order),
                                    request))

    requeue = add  # a preempted request keeps its priority and arrival time

    def peek(self) -> Request:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove(self, request_ids: set[str]) -> None:
        self._heap = [e for e in self._heap if e[-1].request_id not in request_ids]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))


def waiting_queue(policy: str) -> FCFSQueue | PriorityQueue:
    return PriorityQueue() if policy == "priority" else FCFSQueue()


def lowest_priority(running: list[Request]) -> int:
    """The index in running of the request priority scheduling preempts: the highest
    (priority, arrival time), the latest admitted among equals."""
    if not running:
        raise ValueError("no running request to preempt")
    keys = [(r.priority, r.arrival_time) for r in running]
    return max(range(len(keys)), key=lambda i: (keys[i], i))
