"""torch.onnx's notices that do not concern a jacobi-rt user, hidden narrowly during an export.

torch.onnx.export (dynamo) builds its op registry on every call and logs, through the logger of
torch/onnx/_internal/exporter/_registration.py, "torchvision is not installed. Skipping
torchvision::<op>" for each of torchvision's ops (roi_align, roi_pool, deform_conv2d, nms): four
lines per graph, about ops a language model never uses. Only those records are dropped, and only
while the context is open; every other message of that logger still reaches the user.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"
NOTICE = "torchvision is not installed"


class _TorchvisionNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NOTICE)


@contextmanager
def torchvision_notices_hidden() -> Iterator[None]:
    logger, notice = logging.getLogger(REGISTRY_LOGGER), _TorchvisionNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)
