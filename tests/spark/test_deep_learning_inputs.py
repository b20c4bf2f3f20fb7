"""What deep-learning inputs look like on the way from a DataFrame to a model, end to end through Distributor:

- images: a folder of JPEGs read with Spark's ``binaryFile`` source, the label taken from the path; the ranks
  get the files' bytes (a ``binary`` column: a list of ``bytes``) and a ``transform`` in a worker process
  decodes them with PIL, flips and normalises; a small CNN learns the two classes (on local[2], and on the
  standalone cluster, where the bytes are written to the cache and read back by executors);
- text: a ``string`` column (a list of ``str``) tokenized in the loader's worker by a ``tokenizers`` tokenizer
  trained here (handed over as its JSON string and rebuilt once per worker process with ``Tokenizer.from_str``),
  into a tiny BERT built from a config, with plain DDP and with Hugging Face's ``Trainer`` (its train dataloader
  is the rank's loader);
- token sequences of varying length (``array<int>``): padded by the loader, with ``<column>_lengths`` to mask
  the padding in a mean-pooling classifier.

Each model must do clearly better than chance on held-out rows, which it can only do if every batch's inputs
and labels belong to the same rows. Nothing is downloaded: the images are drawn with PIL, the tokenizer is
trained on the sentences, the model is built from a config (random weights).
"""
import functools
import io
import os
import random

import pytest
import torch

from spark_dist import Distributor, get_context

# The functions below that the ranks and the loader's workers run are pickled by reference: each of those processes
# imports this module, so it imports no more than they need (pyspark only inside the driver-side helpers).

BETTER_THAN_CHANCE = 0.8  # two balanced classes everywhere below: chance is 0.5


def all_reduced_accuracy(correct: int, total: int) -> float:
    """The accuracy over every rank's held-out rows."""
    import torch.distributed as dist

    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


# -- images: JPEG bytes -> PIL in the loader's worker -> a small CNN -----------------------------------------
def draw_jpeg(rng, label: int) -> bytes:
    """A 32x32 JPEG on a noisy background: class 0 a reddish square, class 1 a bluish circle, of random size and
    place."""
    import numpy as np
    from PIL import Image, ImageDraw

    image = Image.fromarray(rng.integers(0, 90, size=(32, 32, 3), dtype=np.uint8))
    size = int(rng.integers(10, 19))
    x, y = (int(v) for v in rng.integers(1, 31 - size, size=2))
    if label == 0:
        colour = (int(rng.integers(170, 256)), int(rng.integers(0, 70)), int(rng.integers(0, 70)))
        ImageDraw.Draw(image).rectangle([x, y, x + size, y + size], fill=colour)
    else:
        colour = (int(rng.integers(0, 70)), int(rng.integers(0, 90)), int(rng.integers(170, 256)))
        ImageDraw.Draw(image).ellipse([x, y, x + size, y + size], fill=colour)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_jpegs(folder, per_class: int, seed: int) -> None:
    """``folder/class0/*.jpg`` and ``folder/class1/*.jpg``, ``per_class`` images each."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for label in (0, 1):
        os.makedirs(os.path.join(folder, f"class{label}"))
        for i in range(per_class):
            with open(os.path.join(folder, f"class{label}", f"img_{i:03d}.jpg"), "wb") as f:
                f.write(draw_jpeg(rng, label))


def jpeg_frame(spark, folder):
    """The JPEGs under ``folder`` as ``content binary, label int``, the label from the path's ``class<N>``."""
    from pyspark.sql import functions as F

    files = (spark.read.format("binaryFile").option("pathGlobFilter", "*.jpg")
             .option("recursiveFileLookup", "true").load(str(folder)))
    return files.select("content", F.regexp_extract("path", r"/class(\d)/", 1).cast("int").alias("label"))


def decode_jpegs(batch, augment=True):
    """The loader's transform, run in its worker process: JPEG bytes -> a normalised float tensor [B, 3, 32, 32],
    each image flipped left-right with probability 1/2 when ``augment`` (``random`` is seeded per batch)."""
    import numpy as np
    from PIL import Image

    assert isinstance(batch["content"], list) and all(isinstance(b, bytes) for b in batch["content"])
    images = []
    for data in batch["content"]:
        pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32) / 255.0
        if augment and random.random() < 0.5:
            pixels = pixels[:, ::-1]
        images.append(pixels)
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)
    return {"image": ((x - 0.5) / 0.25).contiguous(), "label": batch["label"]}


def tiny_cnn():
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 2))


def train_images(epochs):
    import torch.distributed as dist
    from torch import nn

    ctx = get_context()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(tiny_cnn())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = ctx.loader("train", 32, transform=decode_jpegs, workers=1)  # one loader: its worker serves every epoch
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            assert batch["image"].shape == (32, 3, 32, 32) and batch["image"].dtype == torch.float32
            assert batch["label"].dtype == torch.int64
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(batch["image"]), batch["label"])
            loss.backward()
            optimizer.step()
        ctx.report(epoch=epoch, loss=loss.item())
    loader.close()
    model.eval()
    correct = total = 0
    with torch.no_grad():  # the held-out images, not flipped, decoded in this thread (workers=0)
        for batch in ctx.loader("val", 64, shuffle=False, drop_last=False,
                                transform=functools.partial(decode_jpegs, augment=False)):
            correct += int((model(batch["image"]).argmax(1) == batch["label"]).sum())
            total += len(batch["label"])
    accuracy = all_reduced_accuracy(correct, total)
    dist.destroy_process_group()
    return {"accuracy": accuracy, "held_out": total, "loss": loss.item()}


def check_images(spark, tmp_path):
    write_jpegs(tmp_path / "train", per_class=150, seed=0)
    write_jpegs(tmp_path / "val", per_class=50, seed=1)
    train_df, val_df = jpeg_frame(spark, tmp_path / "train"), jpeg_frame(spark, tmp_path / "val")
    assert dict(train_df.dtypes) == {"content": "binary", "label": "int"}
    d = Distributor(num_processes=2, verbose=False)
    result = d.run(train_images, 3, datasets={"train": train_df, "val": val_df})
    print(f"images: held-out accuracy {result['accuracy']:.3f}, last loss {result['loss']:.3f}")
    assert result["held_out"] == 50  # rank 0's half of the 100 held-out images
    assert result["accuracy"] > BETTER_THAN_CHANCE
    assert [r["epoch"] for r in d.history if r["rank"] == 0] == [0, 1, 2]


def test_jpeg_bytes_decoded_by_a_transform_train_a_cnn(spark_local, tmp_path):
    pytest.importorskip("PIL")
    check_images(spark_local, tmp_path)


def test_jpeg_bytes_decoded_by_a_transform_train_a_cnn_standalone(spark_standalone, tmp_path):
    """The same on the standalone cluster: executors write the JPEG bytes to the cache, ranks in other
    executors read them."""
    pytest.importorskip("PIL")
    check_images(spark_standalone, tmp_path)


# -- text: strings -> a tokenizer trained here, in the loader's worker -> a tiny BERT --------------------------
SHARED_WORDS = "the a of and to in is it was very quite rather some this that".split()
CLASS_WORDS = (
    "sun beach warm summer sand swim holiday bright hot sea wave shell coast lemonade picnic".split(),
    "snow ice cold winter frost ski sledge freezing blizzard scarf glove fireplace chill sleet igloo".split(),
)


def sentences(n: int, seed: int):
    """``n`` (sentence, label) pairs, labels alternating: 5 to 14 words, about 40% of them from the label's own
    vocabulary, the rest shared by both."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = i % 2
        words = [rng.choice(CLASS_WORDS[label]) if rng.random() < 0.4 else rng.choice(SHARED_WORDS)
                 for _ in range(rng.randint(5, 14))]
        out.append((" ".join(words), label))
    return out


def train_tokenizer(texts) -> str:
    """A word-level tokenizer trained on ``texts``, as its JSON (``Tokenizer.from_str`` rebuilds it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    return tokenizer.to_str()


@functools.lru_cache(maxsize=4)
def tokenizer_from(tokenizer_json: str, max_length: int = 16):
    """The tokenizer rebuilt from its JSON, padding each batch to its longest sentence; once per process."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    tokenizer.enable_truncation(max_length)
    return tokenizer


def tokenize(tokenizer_json, batch):
    """The loader's transform: a batch's sentences (a list of ``str``) -> what BERT takes."""
    assert isinstance(batch["text"], list) and all(isinstance(t, str) for t in batch["text"])
    encodings = tokenizer_from(tokenizer_json).encode_batch(batch["text"])
    return {"input_ids": torch.tensor([e.ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
            "labels": batch["label"]}


def tiny_bert(tokenizer_json):
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=tokenizer_from(tokenizer_json).get_vocab_size(), hidden_size=32,
                        num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, num_labels=2)
    return BertForSequenceClassification(config)


def held_out_text_accuracy(model, tokenizer_json) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in get_context().loader("val", 64, shuffle=False, drop_last=False,
                                          transform=functools.partial(tokenize, tokenizer_json)):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            correct += int((logits.argmax(1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return all_reduced_accuracy(correct, total)


def train_text(tokenizer_json, epochs):
    import torch.distributed as dist
    from torch import nn

    ctx = get_context()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(tiny_bert(tokenizer_json))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = ctx.loader("train", 32, transform=functools.partial(tokenize, tokenizer_json), workers=1)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
    loader.close()
    accuracy = held_out_text_accuracy(model.module, tokenizer_json)
    dist.destroy_process_group()
    return {"accuracy": accuracy, "loss": loss.item()}


def train_text_with_hf_trainer(tokenizer_json, epochs, root):
    """transformers' Trainer inside the rank: TrainingArguments sets up the gloo process group from the variables
    spark_dist sets, and the train dataloader is this rank's loader (Trainer calls its ``set_epoch``)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import Trainer, TrainingArguments

    ctx = get_context()
    args = TrainingArguments(output_dir=root, num_train_epochs=epochs, per_device_train_batch_size=32,
                             learning_rate=3e-3, lr_scheduler_type="constant", use_cpu=True, report_to=[],
                             save_strategy="no", logging_steps=9, ddp_backend="gloo",
                             ddp_find_unused_parameters=False, disable_tqdm=True, seed=0)
    torch.manual_seed(0)
    loader = ctx.loader("train", args.per_device_train_batch_size,
                        transform=functools.partial(tokenize, tokenizer_json), workers=1)

    class SparkDataTrainer(Trainer):
        def get_train_dataloader(self):
            return loader  # already this rank's shard: no sampler, no accelerate sharding on top

    trainer = SparkDataTrainer(model=tiny_bert(tokenizer_json), args=args)
    metrics = trainer.train().metrics
    loader.close()
    accuracy = held_out_text_accuracy(trainer.model, tokenizer_json)
    return {"accuracy": accuracy, "world_size": args.world_size, "global_step": trainer.state.global_step,
            "steps_per_epoch": len(loader), "train_loss": metrics["train_loss"]}


@pytest.fixture
def text_frames(spark_local):
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    train, val = sentences(600, seed=0), sentences(200, seed=1)
    schema = "text string, label int"
    return train_tokenizer([t for t, _ in train]), spark_local.createDataFrame(train, schema), \
        spark_local.createDataFrame(val, schema)


def test_strings_tokenized_in_the_loader_train_a_bert(text_frames):
    tokenizer_json, train_df, val_df = text_frames
    result = Distributor(num_processes=2, verbose=False).run(train_text, tokenizer_json, 4,
                                                             datasets={"train": train_df, "val": val_df})
    print(f"text (DDP): held-out accuracy {result['accuracy']:.3f}, last loss {result['loss']:.3f}")
    assert result["accuracy"] > BETTER_THAN_CHANCE


def test_hugging_face_trainer_reads_the_rank_loader(text_frames, tmp_path):
    tokenizer_json, train_df, val_df = text_frames
    result = Distributor(num_processes=2, verbose=False).run(train_text_with_hf_trainer, tokenizer_json, 4,
                                                             str(tmp_path), datasets={"train": train_df, "val": val_df})
    print(f"text (Trainer): held-out accuracy {result['accuracy']:.3f}, train loss {result['train_loss']:.3f}")
    assert result["world_size"] == 2
    assert result["steps_per_epoch"] == 300 // 32  # each rank's half of the 600 sentences, full batches only
    assert result["global_step"] == 4 * result["steps_per_epoch"]
    assert result["accuracy"] > BETTER_THAN_CHANCE


# -- token sequences of varying length: padded by the loader, masked with <column>_lengths -------------------
def token_sequences(n: int, seed: int):
    """``n`` (token ids, label) pairs, 2 to 20 tokens each: class 0 draws ids from 1..30, class 1 from 20..50."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = i % 2
        low, high = (1, 30) if label == 0 else (20, 50)
        out.append(([rng.randint(low, high) for _ in range(rng.randint(2, 20))], label))
    return out


class MeanPoolClassifier(torch.nn.Module):
    """Token embeddings averaged over each row's own length (the padding masked out), then a linear layer."""

    def __init__(self, vocab_size: int, dim: int = 16):
        super().__init__()
        self.embedding, self.head = torch.nn.Embedding(vocab_size, dim), torch.nn.Linear(dim, 2)

    def forward(self, tokens, lengths):
        mask = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).float()
        pooled = (self.embedding(tokens) * mask[..., None]).sum(1) / lengths[:, None].float()
        return self.head(pooled)


def train_sequences(epochs):
    import torch.distributed as dist
    from torch import nn

    ctx = get_context()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(MeanPoolClassifier(51))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)

    def logits(batch):
        tokens, lengths = batch["tokens"], batch["tokens_lengths"]
        # The loader's padding: each row's ids (all >= 1), then zeros up to the batch's longest row.
        assert tokens.dtype == lengths.dtype == torch.int64
        assert tokens.shape[1] == int(lengths.max()) and torch.equal((tokens != 0).sum(1), lengths)
        return model(tokens, lengths)

    loader = ctx.loader("train", 32)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(logits(batch), batch["label"])
            loss.backward()
            optimizer.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in ctx.loader("val", 64, shuffle=False, drop_last=False):
            correct += int((logits(batch).argmax(1) == batch["label"]).sum())
            total += len(batch["label"])
    accuracy = all_reduced_accuracy(correct, total)
    dist.destroy_process_group()
    return {"accuracy": accuracy, "loss": loss.item()}


def test_token_sequences_of_varying_length_are_padded_and_masked(spark_local):
    schema = "tokens array<int>, label int"
    train_df = spark_local.createDataFrame(token_sequences(1000, seed=0), schema)
    val_df = spark_local.createDataFrame(token_sequences(200, seed=1), schema)
    result = Distributor(num_processes=2, verbose=False).run(train_sequences, 3,
                                                             datasets={"train": train_df, "val": val_df})
    print(f"sequences: held-out accuracy {result['accuracy']:.3f}, last loss {result['loss']:.3f}")
    assert result["accuracy"] > BETTER_THAN_CHANCE
