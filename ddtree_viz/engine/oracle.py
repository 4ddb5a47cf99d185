"""An oracle drafter for exercising verification: it drafts the target's true greedy continuation, but at a
chosen rank per position (the other candidates random), so trees hold long correct paths at depths and
sibling orders we control. Used by the tests and the GPU exactness runs; it needs the greedy ids up front."""

from __future__ import annotations

import numpy as np
import torch

from .proposers import Proposer


class OracleProposer(Proposer):
    def __init__(self, greedy_ids, prompt_len: int, ranks: list[int], vocab: int, block_size: int = 8, seed: int = 0):
        self.greedy, self.prompt_len, self.ranks, self.vocab = list(greedy_ids), prompt_len, list(ranks), vocab
        self.block_size, self.feature_layer_ids = block_size, None
        self.rng = np.random.default_rng(seed)

    def propose(self, root_token_id: int, committed_len: int, new_features, block_size: int) -> torch.Tensor:
        rows = []
        for depth in range(1, block_size):
            # a peaked, ranked distribution: the top four ranks 1 nat apart, the rest far below
            logits = np.concatenate([-np.arange(4.0), -8 - np.sort(self.rng.random(self.vocab - 4))])
            order = self.rng.permutation(self.vocab)
            g = committed_len + depth - self.prompt_len  # index of this depth's token among the generated ones
            if g < len(self.greedy):
                true = self.greedy[g]
                rank = self.ranks[(committed_len + depth) % len(self.ranks)]
                order = np.insert(np.delete(order, np.flatnonzero(order == true)), rank, true)
            row = np.empty(self.vocab)
            row[order] = logits
            rows.append(row)
        return torch.log_softmax(torch.tensor(np.array(rows), dtype=torch.float32), dim=-1)
