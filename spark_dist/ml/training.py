"""The rank side of ``TorchEstimator.fit``: one module-level function that every rank runs.

It reads its equal shard through ``ctx.loader``, trains with DDP (gloo, or NCCL on GPUs) or Horovod, and
returns the trained weights and the per-epoch history from rank 0. On CPU, a model whose gradients make one DDP
bucket trains as DDP would train it, without DDP or torch.optim's classes, which import ``torch._dynamo``
(``gradients.Replicas`` and torch's functional optimizers, ``optimizers``): :func:`training_path` chooses, on the
driver. Nothing here imports Spark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class TrainSpec:
    """Everything a rank needs, built and checked on the driver."""

    # {"model": torch module, "loss": name or callable, "optimizer": name or callable (parameters, lr)},
    # by persistence.dumps: classes and functions from modules executors cannot import travel by value.
    objects: bytes
    loss: str                      # a name from params.LOSSES, or "callable"
    feature_columns: tuple         # one vector/array column, or numeric columns stacked in this order
    stack_features: bool           # True: the columns are scalars to stack into one [batch, n] tensor
    label_column: str
    batch_size: int
    epochs: int
    learning_rate: float
    scale_learning_rate: bool
    warmup_epochs: float
    backend: str                   # "ddp" or "horovod"
    use_gpu: bool
    seed: int
    has_validation: bool
    path: str = "ddp"              # training_path(...)["ranks"]: "replicas", "ddp" or "horovod"
    # objects["transform"] (and "inference_transform" for the validation rows) turns each batch of the feature
    # columns into the model's input (spark_dist.ml.transforms), in this many loader workers per rank.
    transformed: bool = False
    transform_workers: int = 0
    # maxRetries > 0: rank 0 checkpoints at each epoch's end and every rank of a retry goes on from it.
    resumable: bool = False


def learning_rate_at(step: int, base: float, world_size: int, warmup_steps: int, scale: bool) -> float:
    """Goyal et al. (2017): the learning rate grows linearly with the global batch (``base`` x world size),
    reached by a linear ramp from ``base`` over ``warmup_steps`` so that early large steps do not diverge."""
    if not scale or world_size == 1:
        return base
    target = base * world_size
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base + (target - base) * (step + 1) / warmup_steps


def training_path(module, optimizer, backend: str, use_gpu: bool) -> Dict[str, str]:
    """How the ranks will train ``module``: ``{"ranks", "gradients", "optimizer"}``, for the driver's log, the
    fitted model and :class:`TrainSpec` (the ranks follow it).

    ``"replicas"`` on CPU for a model whose gradients make one DDP bucket (:func:`gradients.one_bucket`; the ranks
    move the module to CPU): DDP's arithmetic without DDP, a named optimizer as torch's functional one. Else
    ``"ddp"`` (gloo on CPU, NCCL on GPUs) with torch.optim's class, or ``"horovod"``.
    """
    from spark_dist.ml.gradients import one_bucket

    named = None if callable(optimizer) else optimizer
    if backend == "horovod":
        return {"ranks": "horovod", "gradients": "Horovod DistributedOptimizer all-reduce",
                "optimizer": f"torch.optim.{_CLASSES[named]}" if named else "callable"}
    if not use_gpu and one_bucket(module.parameters()):
        return {"ranks": "replicas", "gradients": "one all-reduce of all gradients after backward (as DDP's one "
                                                  "bucket), no DDP",
                "optimizer": f"torch.optim.{named}.{named} (functional)" if named else "callable"}
    return {"ranks": "ddp", "gradients": f"DDP bucketed all-reduce ({'nccl' if use_gpu else 'gloo'})",
            "optimizer": f"torch.optim.{_CLASSES[named]}" if named else "callable"}


_CLASSES = {"adam": "Adam", "sgd": "SGD", "adamw": "AdamW"}


def make_loss(loss):
    import torch.nn.functional as F

    if callable(loss):
        return loss
    fn = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss, "bce_with_logits": F.binary_cross_entropy_with_logits}
    inner = fn[loss]

    def compute(output, label):
        if loss != "cross_entropy" and output.dim() == label.dim() + 1 and output.shape[-1] == 1:
            output = output.squeeze(-1)  # a [batch, 1] head against [batch] targets
        return inner(output, label)
    return compute


def make_optimizer(optimizer, parameters, lr: float, functional: bool = False):
    """The optimizer a name or callable gives; ``functional``: a named one as torch's functional optimizer
    (spark_dist.ml.optimizers: torch.optim's arithmetic, without importing torch._dynamo) where it serves the
    parameters, else torch.optim's class."""
    import torch

    if callable(optimizer):
        return optimizer(parameters, lr)
    parameters = list(parameters)
    if functional:
        from spark_dist.ml import optimizers

        if optimizers.serves(parameters):
            return optimizers.BY_NAME[optimizer](parameters, lr)
    return getattr(torch.optim, _CLASSES[optimizer])(parameters, lr=lr)


def correct_count(loss, output, label):
    """Rows predicted right, for the losses that classify; ``None`` for the others."""
    if loss == "cross_entropy":
        return (output.argmax(dim=-1) == label).sum()
    if loss == "bce_with_logits":
        if output.dim() == label.dim() + 1 and output.shape[-1] == 1:
            output = output.squeeze(-1)
        right = (output > 0).to(label.dtype) == label
        return (right.all(dim=-1) if right.dim() > 1 else right).sum()  # multi-label: every label right
    return None


def _inputs_and_labels(batch, spec: TrainSpec, device):
    """The model's input and the labels of a batch, on ``device``."""
    import torch

    from spark_dist.ml.transforms import to_device

    if spec.transformed:  # what transforms.FitTransform made of the batch
        return to_device(batch["inputs"], device), batch["label"].to(device)
    if spec.stack_features:
        x = torch.stack([batch[c] for c in spec.feature_columns], dim=1)
    else:
        x = batch[spec.feature_columns[0]]
    return x.to(device), batch[spec.label_column].to(device)


def _loaders(ctx, spec: TrainSpec, objects, dtypes) -> Dict[str, Any]:
    """The rank's loaders, made once (a transform's workers then serve every epoch): ``"train"`` shuffled,
    ``"val"`` (when there are validation rows) in order, every row once."""
    from spark_dist.ml.transforms import FitTransform

    columns = list(spec.feature_columns) + [spec.label_column]

    def options(fn):
        if not spec.transformed:
            return {"columns": columns, "dtypes": dtypes}
        return {"columns": columns, "dtypes": dtypes or None, "transform": FitTransform(fn, spec.label_column),
                "workers": spec.transform_workers}

    # Full batches when every rank has at least one; else one short batch per epoch (same size on all ranks).
    drop_last = ctx.datasets["train"].num_rows // ctx.world_size >= spec.batch_size
    loaders = {"train": ctx.loader("train", spec.batch_size, shuffle=True, seed=spec.seed % (2 ** 31),
                                   drop_last=drop_last, **options(objects.get("transform")))}
    if spec.has_validation:
        fn = objects.get("inference_transform") or objects.get("transform")
        loaders["val"] = ctx.loader("val", max(spec.batch_size, 256), shuffle=False, seed=0, drop_last=False,
                                    **options(fn))
    return loaders


def train_ranks(spec: TrainSpec) -> Optional[Dict[str, Any]]:
    """Runs on every rank. Returns ``{"state_dict", "history"}`` on rank 0, ``None`` elsewhere."""
    import io

    import torch
    import torch.distributed as dist

    from spark_dist import get_context
    from spark_dist.ml.gradients import Replicas
    from spark_dist.ml.transforms import forward

    ctx = get_context()
    device = ctx.device
    objects = torch.load(io.BytesIO(spec.objects), map_location="cpu", weights_only=False)
    module = objects["model"].to(device)
    loss_fn = make_loss(objects["loss"])
    hvd = None
    average_gradients = None  # the replicas' step between backward() and the optimizer's
    if spec.backend == "horovod":
        import horovod.torch as hvd

        hvd.init()
        model = module
        optimizer = make_optimizer(objects["optimizer"], model.parameters(), spec.learning_rate)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    else:
        dist.init_process_group("nccl" if spec.use_gpu else "gloo")
        replicas = spec.path == "replicas"  # what DDP does for one bucket, without importing torch._dynamo
        if replicas:
            model = Replicas(module)
            average_gradients = model.average_gradients
        else:
            model = torch.nn.parallel.DistributedDataParallel(
                module, device_ids=[device.index] if spec.use_gpu else None)
        optimizer = make_optimizer(objects["optimizer"], module.parameters(), spec.learning_rate, functional=replicas)

    def sum_over_ranks(values: List[float]) -> List[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        if hvd is not None:
            tensor = hvd.allreduce(tensor, op=hvd.Sum, name="metrics")
        else:
            tensor = tensor.to(device) if spec.use_gpu else tensor
            dist.all_reduce(tensor)
        return tensor.cpu().tolist()

    # A transform's input is what the loader gives by default (it may not be numbers); the model's is float32.
    dtypes = {} if spec.transformed else {c: torch.float32 for c in spec.feature_columns}
    if spec.loss != "callable":  # a callable gets the loader's default: int64 for integer labels, else float32
        dtypes[spec.label_column] = torch.int64 if spec.loss == "cross_entropy" else torch.float32
    history: List[Dict[str, Any]] = []
    step = first_epoch = 0
    saved = ctx.load_checkpoint() if spec.resumable else None
    if saved is not None:  # a retry: go on after the last epoch that ended, as the uninterrupted fit would
        module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        history, step, first_epoch = saved["history"], saved["step"], saved["epoch"] + 1
    loaders: Dict[str, Any] = {}
    try:
        loaders = _loaders(ctx, spec, objects, dtypes)
        loader = loaders["train"]
        for epoch in range(first_epoch, spec.epochs):
            # Dropout and friends differ per rank and epoch, and an epoch draws the same after a retry.
            torch.manual_seed((spec.seed + 1_000_003 * epoch) % (2 ** 63) + ctx.rank)
            model.train()
            loader.set_epoch(epoch)
            warmup_steps = int(round(spec.warmup_epochs * len(loader)))
            loss_sum = torch.zeros((), dtype=torch.float64)
            rows = 0
            for batch in loader:
                lr = learning_rate_at(step, spec.learning_rate, ctx.world_size, warmup_steps,
                                      spec.scale_learning_rate)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, y = _inputs_and_labels(batch, spec, device)
                optimizer.zero_grad()
                loss = loss_fn(forward(model, x), y)
                loss.backward()
                if average_gradients is not None:
                    average_gradients()
                optimizer.step()
                loss_sum += loss.detach().double().cpu() * len(y)
                rows += len(y)
                step += 1
            total, count = sum_over_ranks([float(loss_sum), float(rows)])
            record: Dict[str, Any] = {"epoch": epoch, "train_loss": total / max(count, 1.0), "learning_rate": lr}
            if spec.has_validation:
                record.update(_validate(model, spec, loss_fn, loaders["val"], device, sum_over_ranks))
            history.append(record)
            if ctx.rank == 0:
                ctx.report(**record)
            if spec.resumable:
                ctx.save_checkpoint({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                                     "history": history, "step": step, "epoch": epoch})
    finally:
        for each in loaders.values():
            getattr(each, "close", lambda: None)()  # a transform's worker processes
        if hvd is not None:
            hvd.shutdown()
        elif dist.is_initialized():
            dist.destroy_process_group()
    if ctx.rank != 0:
        return None
    return {"state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()}, "history": history}


def _validate(model, spec: TrainSpec, loss_fn, loader, device, sum_over_ranks) -> Dict[str, float]:
    """Loss (and accuracy when the loss classifies) over the validation set, every rank its shard.

    ``drop_last=False`` so every row counts; the last ranks repeat at most ``world_size - 1`` rows to keep
    the shards equal, which moves the figures by at most that many rows' worth.
    """
    import torch

    from spark_dist.ml.transforms import forward

    model.eval()
    loss_sum, correct, rows = 0.0, 0.0, 0.0
    classifies = True
    with torch.no_grad():
        for batch in loader:
            x, y = _inputs_and_labels(batch, spec, device)
            output = forward(model, x)
            loss_sum += float(loss_fn(output, y)) * len(y)
            hits = correct_count(spec.loss, output, y)
            classifies = hits is not None
            correct += float(hits) if classifies else 0.0
            rows += len(y)
    loss_total, correct_total, count = sum_over_ranks([loss_sum, correct, rows])
    out = {"val_loss": loss_total / max(count, 1.0)}
    if classifies:
        out["val_accuracy"] = correct_total / max(count, 1.0)
    return out
