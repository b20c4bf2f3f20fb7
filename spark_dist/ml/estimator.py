"""``TorchEstimator``: a Spark ML Estimator that trains a torch module on a DataFrame through
:class:`spark_dist.Distributor` (DDP or Horovod) and returns a :class:`TorchModel`."""
from __future__ import annotations

import logging
from typing import Any, Dict

from pyspark import keyword_only
from pyspark.ml import Estimator

from ..errors import ConfigError
from ..driver.tracking import Tracker
from . import inputs, transform_inputs
from .model import TorchModel
from .params import TorchParams
from .persistence import TorchPersistence, dumps, loads
from .training import TrainSpec, train_ranks, training_path

log = logging.getLogger("spark_dist")


class TorchEstimator(Estimator, TorchParams, TorchPersistence):
    """Trains ``model`` on ``numProcesses`` Spark barrier tasks; each reads an equal shard of the DataFrame.

    >>> est = TorchEstimator(model=nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
    ...                      featuresCol="features", labelCol="label", loss="cross_entropy",
    ...                      epochs=20, batchSize=32, learningRate=0.003, numProcesses=2)
    >>> model = est.fit(train_df)          # a TorchModel; model.history has one record per epoch
    >>> model.transform(test_df)           # + prediction (double) and rawPrediction (vector)

    Params (Spark camelCase; ``explainParams()`` lists them with their defaults):

    - ``model``: the ``torch.nn.Module``; training starts from its current weights (it is not changed: the
      fitted model holds a trained copy). It must take a float tensor ``[batch, n_features]`` (without a
      ``transformFn``), or what ``transformFn`` returns.
    - ``featuresCol``: an ML vector column, an ``array<number>`` column, or a list of numeric columns; with a
      ``transformFn``, one column or a list of columns of any kind the loader takes (``binary``, ``string``,
      arrays of varying length, nested arrays, numbers, vectors).
    - ``transformFn``: a function of a batch of the ``featuresCol`` columns (a dict: ``binary`` -> list of
      ``bytes``, ``string`` -> list of ``str``, varying-length arrays -> a tensor padded with 0 plus
      ``"<column>_lengths"``, numbers -> tensors; never the label) returning the model's input: a tensor, a
      tuple of tensors (``model(*x)``) or a dict of tensors (``model(**x)``; one entry: ``model(value)``).
      Decode images, tokenize text, augment (seeded per batch). ``inferenceTransformFn`` (default:
      ``transformFn``): the function for validation rows and :meth:`TorchModel.transform`, e.g. without the
      random augmentation. ``transformWorkers``: processes per rank that run ``transformFn`` (default 0: the
      loader's thread). All three are saved with the stage (:mod:`spark_dist.ml.transforms`).
    - ``labelCol``, ``predictionCol``, ``rawPredictionCol``, ``seed``: as in Spark ML.
    - ``loss``: ``"cross_entropy"`` (labels are class indices 0..C-1 for a C-output model), ``"mse"``,
      ``"bce_with_logits"`` (targets in [0, 1]), or a callable ``(output, label) -> scalar tensor``.
    - ``optimizer``: ``"adam"`` (default), ``"sgd"``, ``"adamw"``, or a callable ``(parameters, lr)``.
    - ``batchSize`` (per process), ``epochs``, ``learningRate``, ``numProcesses``, ``backend``
      (``"ddp"``: DDP over gloo, NCCL with ``useGpu``; ``"horovod"``: ``horovod.torch``), ``useGpu``.
    - ``validationFraction`` (hold out this fraction, chosen by a hash of each row's values and ``seed``:
      equal rows go to the same side) or ``validationCol`` (a boolean column, true = validation row): then
      each epoch's history also has ``val_loss`` (and ``val_accuracy`` for cross_entropy and bce_with_logits).
    - ``scaleLearningRate`` (default on): the linear scaling rule of Goyal et al., "Accurate, Large Minibatch
      SGD" (2017). With N processes the global batch is N x batchSize, so the learning rate used is
      N x learningRate, reached by a linear ramp from learningRate over the first ``warmupEpochs`` epochs
      (default 1; 0 for none). Turn it off to use ``learningRate`` as is. With one process nothing changes.
    - ``verbose``: print each epoch's metrics on the driver (default off; ``model.history`` has them).
    - ``maxRetries`` (default 0): with ``n > 0`` the fit checkpoints at each epoch's end (model, optimizer, history:
      rank 0's, in the run's checkpoint directory, removed once the fit succeeded) and a fit that lost a rank, an
      executor or a Python worker is retried up to ``n`` times (``Distributor``'s ``max_retries`` rule), each
      retry going on from the last epoch that ended: the fitted model is the one an uninterrupted fit gives, bit
      for bit on CPU.

    In ``CrossValidator`` / ``TrainValidationSplit``, each fit is one barrier job holding ``numProcesses``
    task slots; with ``parallelism=n`` the fits run at once, as many as the slots hold, the others waiting
    their turn (:mod:`spark_dist.driver.slots`), with the results of ``parallelism=1``. A DataFrame fitted
    again (the same plan, e.g. every grid point of one fold) reuses its Petastorm cache, written once even
    when parallel fits ask for it together.

    ``fit`` raises :class:`spark_dist.ConfigError` (a ``ValueError``) before any training job when ``model``
    is not set, a feature or label column is missing or not numeric (without a ``transformFn``; with one, of a
    type no loader takes, such as a map), ``inferenceTransformFn`` or ``transformWorkers`` is set without
    ``transformFn``, ``numProcesses`` exceeds the cluster's task slots, or the backend is not installed (these
    before any Spark job at all); when ``transformFn`` or ``inferenceTransformFn`` fails on the first two rows
    or returns what the model cannot take (one small job reads them); or when labels do not fit the model's
    outputs, a column holds nulls or vectors of unequal length, or there are fewer rows than processes (these
    measured by the one job that writes the dataset cache). Each message names the Param or column. A failure
    inside training (a ``transformFn`` failing on a later batch included) raises
    :class:`spark_dist.TrainingFailedError` naming the rank.
    """

    @keyword_only
    def __init__(self, *, model=None, loss="cross_entropy", optimizer="adam", featuresCol="features",
                 labelCol="label", predictionCol="prediction", rawPredictionCol="rawPrediction", batchSize=32,
                 epochs=10, learningRate=1e-3, numProcesses=1, backend="ddp", useGpu=False, seed=None,
                 validationFraction=0.0, validationCol=None, scaleLearningRate=True, warmupEpochs=1.0,
                 verbose=False, transformFn=None, inferenceTransformFn=None, transformWorkers=0,
                 maxRetries=0):
        super().__init__()
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    @keyword_only
    def setParams(self, *, model=None, loss="cross_entropy", optimizer="adam", featuresCol="features",
                  labelCol="label", predictionCol="prediction", rawPredictionCol="rawPrediction", batchSize=32,
                  epochs=10, learningRate=1e-3, numProcesses=1, backend="ddp", useGpu=False, seed=None,
                  validationFraction=0.0, validationCol=None, scaleLearningRate=True, warmupEpochs=1.0,
                  verbose=False, transformFn=None, inferenceTransformFn=None, transformWorkers=0,
                  maxRetries=0):
        """Set the given Params (only those passed; ``None`` leaves a Param as it is)."""
        return self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    # -- setters ------------------------------------------------------------------------------------------
    def setModel(self, value):
        return self._set(model=value)

    def setLoss(self, value):
        return self._set(loss=value)

    def setOptimizer(self, value):
        return self._set(optimizer=value)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)

    def setEpochs(self, value: int):
        return self._set(epochs=value)

    def setLearningRate(self, value: float):
        return self._set(learningRate=value)

    def setNumProcesses(self, value: int):
        return self._set(numProcesses=value)

    def setBackend(self, value: str):
        return self._set(backend=value)

    def setSeed(self, value: int):
        return self._set(seed=value)

    def setValidationFraction(self, value: float):
        return self._set(validationFraction=value)

    def setValidationCol(self, value: str):
        return self._set(validationCol=value)

    def setScaleLearningRate(self, value: bool):
        return self._set(scaleLearningRate=value)

    def setWarmupEpochs(self, value: float):
        return self._set(warmupEpochs=value)

    def setVerbose(self, value: bool):
        return self._set(verbose=value)

    # -- persistence --------------------------------------------------------------------------------------
    def _extra_metadata(self) -> Dict[str, Any]:
        return {}

    def _load_extra_metadata(self, metadata: Dict[str, Any]) -> None:
        pass

    # -- fit ------------------------------------------------------------------------------------------------
    def _fit(self, dataset) -> TorchModel:
        from ..backends import get_backend
        from ..driver.distributor import Distributor

        module = self.getModel()
        if module is None:
            raise ConfigError("model is not set: pass TorchEstimator(model=<torch.nn.Module>) or call setModel")
        loss, backend = self.getLoss(), self.getBackend()
        spark = dataset.sparkSession
        schema = dataset.schema
        fn, inference_fn = transform_inputs.check_params(self)
        if fn is None:
            features = inputs.features_of(schema, self.featureColumns())
        else:
            features = transform_inputs.features_for_transform(schema, self.featureColumns())
        label = self.getLabelCol()
        label_kind = inputs.check_label(schema, label, loss, features)
        validation_col, fraction = self.getValidationCol(), self.getValidationFraction()
        if validation_col and fraction > 0:
            raise ConfigError(f"validationCol={validation_col!r} and validationFraction={fraction:g} are both set; "
                              "choose one")
        if validation_col:
            if inputs.column_kind(schema, validation_col, "validationCol") != inputs.SCALAR:
                raise ConfigError(f"validationCol {validation_col!r} must be a boolean column")
            if validation_col in (*features.columns, label):
                raise ConfigError(f"validationCol {validation_col!r} is also a feature or the label")
        get_backend(backend).check_available()  # Horovod not installed: say so before any job
        inputs.check_slots(spark, self.getNumProcesses(), self.getUseGpu())

        # The model meets the feature width before any job when the schema tells the width. A transform meets
        # the first rows, read by one small job, and the model what it makes of them: before the cache write,
        # or after it where an array column's kind (one length, or a padded sequence) is known only once measured.
        outputs = inputs.model_outputs(module, features.width) if features.width else None
        sampled = None
        if fn is not None:
            kinds = transform_inputs.schema_kinds(schema, features.columns)
            sampled = transform_inputs.sample(dataset, features, kinds)
            if not transform_inputs.has_arrays(schema, features.columns):  # else the cache write tells their kind
                outputs = transform_inputs.check_sample(module, fn, inference_fn, sampled, kinds)
        # Columns by name, and SQL text over columns by position: no Column method (spark_dist.data.schema.sql).
        names = [*features.columns, label]
        columns = [inputs.quoted(c) for c in names]
        if validation_col:
            picked = inputs.by_position(dataset.select(*columns, inputs.quoted(validation_col)))
            flag = f"CAST({inputs.position(len(names))} AS BOOLEAN)"
            kept = [inputs.position(i) for i in range(len(names))]
            datasets = {"train": picked.filter(f"{flag} IS NULL OR NOT {flag}").select(kept).toDF(*names),
                        "val": picked.filter(flag).select(kept).toDF(*names)}
        elif fraction > 0:
            # By each row's content, not randomSplit: the two cache writes read the source twice.
            datasets = inputs.split_by_content(dataset.select(columns), fraction, self.getSeed())
        else:
            datasets = {"train": dataset.select(columns)}
        # One Spark job per DataFrame: the cache write, which also measures the label range and the feature
        # width that the checks below need.
        validation = (f"validationCol={validation_col!r}" if validation_col
                      else f"validationFraction={fraction:g}")
        handles = inputs.prepare(spark, datasets, self.getNumProcesses(), features, label, validation)
        kinds = {}
        if fn is not None:
            kinds, width = {c: handles["train"].column(c).kind for c in features.columns}, None
            if outputs is None:
                outputs = transform_inputs.check_sample(module, fn, inference_fn, sampled, kinds)
        else:
            width = inputs.feature_width(features, handles)
        if outputs is None:
            outputs = inputs.model_outputs(module, width)
        inputs.check_label_values(label, loss, label_kind, outputs, handles)

        path = training_path(module, self.getOptimizer(), backend, self.getUseGpu())
        log.info("spark_dist: %s fits on %d ranks as %s: gradients by %s; optimizer %s", self.uid,
                 self.getNumProcesses(), path["ranks"], path["gradients"], path["optimizer"])
        objects = {"model": module, "loss": loss, "optimizer": self.getOptimizer()}
        if fn is not None:
            objects.update(transform=fn, inference_transform=inference_fn)
        spec = TrainSpec(
            objects=dumps(objects),
            loss="callable" if callable(loss) else loss, feature_columns=features.columns,
            stack_features=features.stacked, label_column=label, batch_size=self.getBatchSize(),
            epochs=self.getEpochs(), learning_rate=self.getLearningRate(),
            scale_learning_rate=self.getScaleLearningRate(), warmup_epochs=self.getWarmupEpochs(),
            backend=backend, use_gpu=self.getUseGpu(), seed=self.getSeed(), has_validation="val" in handles,
            path=path["ranks"], transformed=fn is not None, transform_workers=self.getTransformWorkers(),
            resumable=self.getMaxRetries() > 0)
        distributor = Distributor(num_processes=self.getNumProcesses(), backend=backend, use_gpu=self.getUseGpu(),
                                  verbose=self.getVerbose(), spark=spark, max_retries=self.getMaxRetries())
        # With MLflow in use the fit is one MLflow run: the estimator's params and the model; the training run
        # logs into it (its per-epoch reports: the history's metrics at their epochs).
        tracker = Tracker(f"{self.uid}-fit", {**{p.name: v for p, v in self.extractParamMap().items()
                                                 if isinstance(v, (int, float, str, bool))},
                                              "trainingPath": path["ranks"]})
        try:
            result = distributor.run(train_ranks, spec, datasets=handles)
            model = self._model_from(result, spec, width, outputs)
            model._feature_kinds = kinds
            model._training_path = dict(path)
            tracker.model(model)
        except BaseException:
            tracker.end(failed=True)
            raise
        tracker.end()
        return model

    def _model_from(self, result, spec, width, outputs) -> TorchModel:
        """The fitted model: a fresh copy of the module with rank 0's weights, this estimator's Params."""
        trained = loads(spec.objects)["model"]  # a fresh copy: the user's module keeps its weights
        trained.load_state_dict(result["state_dict"])
        trained.eval()
        model = TorchModel()
        model._resetUid(self.uid)  # as Spark's own estimators do: the model shares the estimator's uid
        self._copyValues(model)
        model._set(model=trained)
        model._history = list(result["history"])
        model._num_features, model._num_outputs = width, outputs
        return model
