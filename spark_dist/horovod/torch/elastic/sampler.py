"""``hvd.elastic.ElasticSampler``: Horovod's sampler that shards a dataset across ranks and remembers how far
the epoch got, so that a restored state resumes where it was committed."""
from __future__ import annotations

import math
import random

import torch.utils.data


class ElasticSampler(torch.utils.data.Sampler):
    """Like ``DistributedSampler``; also records processed samples (``record_batch``) so that ``reset()`` (after
    a restore or a sync) shards only what this epoch has left.

    Use: put it in the ``TorchState``, call ``record_batch`` after each batch and ``set_epoch`` at the end of each
    epoch.

    Args:
        dataset: the dataset (of constant size).
        shuffle: shuffle indices, the same way on every rank (default True).
        seed: the shuffle's seed, the same on every rank (default 0).

    Raises:
        ValueError: (on ``reset``, so also at construction) Horovod is not initialized.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        """Start ``epoch``: a new shuffle, nothing processed yet. Call it at the end of an epoch, not at the start,
        so that a partly done epoch is not done again."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Record that every rank processed ``batch_size`` more samples."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self):
        """Shard the samples this epoch has left among the current ranks."""
        from ..basics import rank, size

        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)  # the same order on every rank
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) * 1.0 / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        # pad with the first indices so every rank gets num_samples, then deal them out round-robin
        self.indices = self.remaining_indices[:]
        self.indices += self.indices[:(self.total_size - len(self.indices))]
        self.indices = self.indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
