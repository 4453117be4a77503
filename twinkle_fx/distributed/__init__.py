"""Distributed training helpers: what DDP and FSDP2 leave on the table for models twinkle_fx serves.

- :func:`tied_embedding_ddp`: DDP that all-reduces a tied LM head's gradient during the backward
  instead of after it, and exchanges the embedding's part as rows.
- :func:`use_copy_engine_collectives`: FSDP2's all-gathers and reduce-scatters as copy-engine transfers
  between one host's GPUs, which leave every SM to the GEMMs they overlap.
"""

from .copy_engine import use_copy_engine_collectives
from .tied_embedding import TiedEmbeddingReduction, find_tied_pair, tied_embedding_ddp

__all__ = ["TiedEmbeddingReduction", "find_tied_pair", "tied_embedding_ddp", "use_copy_engine_collectives"]
