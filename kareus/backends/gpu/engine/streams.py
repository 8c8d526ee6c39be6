"""Main and side CUDA streams: launching a collective on the side stream and joining it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kareus.backends.gpu.engine.collectives import Work


class Streams:
    """Main and side CUDA streams; on CPU everything is immediate."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device=device) if self.cuda else None

    def launch(self, fn: Callable[[], Work], side: bool) -> torch.cuda.Event | None:
        """Run the collective ``fn`` on the side stream, starting once the main stream reaches
        this point; returns a handle for :meth:`join`. ``side=False``: on the main stream."""
        if not self.cuda:
            fn().wait()
            return None
        if not side:
            fn().wait()  # NCCL's stream waits for main; main waits for NCCL
            return None
        main = torch.cuda.current_stream()
        ready = main.record_event()
        assert self.side is not None
        with torch.cuda.stream(self.side):
            self.side.wait_event(ready)
            fn().wait()
            return self.side.record_event()

    def join(self, handle: torch.cuda.Event | None) -> None:
        """Make the main stream wait for a side-stream collective."""
        if handle is not None:
            torch.cuda.current_stream().wait_event(handle)
