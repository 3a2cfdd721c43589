"""The entry point of distributed training: ``from singa_lite import dist; comm = dist.init()``.

This module only re-exports the public names of the communication layer, singa_lite.comm (communicators,
backends, bootstraps; its docstring says how ``init`` picks a backend). The data-parallel wrappers that use
a communicator live in singa_lite.parallel (``DistOpt``, also ``opt.DistOpt`` as in SINGA; ``ddp``;
``DataParallel``). ``dist.elastic`` is comm/elastic_run.py: in-process elasticity, ``dist.elastic.run(train)(state)``
(docs/elastic.md). The package is not called ``dist`` because packaging tools write their build output to
folders of that name.
"""
from __future__ import annotations

from .comm import *  # noqa: F403 - the façade: exactly comm's public names
from .comm import __all__  # noqa: F401
from .comm import elastic_run as elastic  # noqa: F401 - dist.elastic.run / State / init: in-process elasticity
