"""Images per second of a JPEG transform through spark_dist's transform workers against a plain process pool
(a script, not a test).

    python bench/bench_transform.py [--images 2000] [--size 64] [--batch-size 64] [--workers 2] [--repeat 5]
                                    [--out results.json]

Data: ``--images`` random ``--size`` x ``--size`` RGB JPEGs made with PIL (quality 90), in batches of
``--batch-size`` (a dict: ``image`` -> list of JPEG bytes, ``label`` -> numpy array), as a loader gives a
``binary`` column.

Transform (per batch): decode with PIL, random crop to 3/4 of the side, random horizontal flip, normalise
with the ImageNet mean and std, stack into one float32 tensor.

Ways, each over every batch once per round (the workers are started before the rounds, so starting them is
not timed; it is printed apart):

  (a) ``multiprocessing.Pool(k).imap(transform, batches)``: the ceiling. Workers forked (this script has
      no CUDA or threads to worry about), one torch thread each, results passed through shared memory by
      torch's reductions
  (b) ``TransformWorkers(transform, workers=k).map(batches)``: the stage, seeded per batch
  (c) ``workers=0``: the transform in this process, for scale

Prints images/s (best round), the CPU seconds this process spent (least over the rounds; with workers, the
consumer's share, which a rank pays beside its training step) and the ratio of (b) to (a), both the ratio of
best rounds and the median of the ratios within a round; ``--out FILE`` also writes the figures as JSON.
Worker start-up is untimed in both ways; on a machine whose cores are busy with other work the ratio means
little, so read it with the machine's load.
"""
import argparse
import io
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def decode_augment(batch):
    """The transform every way runs: JPEG decode, random crop, random flip, normalise, stack."""
    from PIL import Image

    images = []
    for data in batch["image"]:
        img = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())
        img = img.permute(2, 0, 1).float().div_(255)
        side = img.shape[-1] * 3 // 4
        top, left = torch.randint(0, img.shape[-1] - side + 1, (2,)).tolist()
        img = img[:, top:top + side, left:left + side]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        images.append((img - MEAN) / STD)
    return {"image": torch.stack(images), "label": torch.as_tensor(batch["label"])}


def make_jpegs(images: int, size: int, seed: int = 0) -> list:
    """``images`` random ``size`` x ``size`` RGB JPEGs (quality 90), as bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    jpegs = []
    for _ in range(images):
        buf = io.BytesIO()
        # Smooth noise (a few random blobs, upscaled) rather than white noise: closer to a photo's JPEG size.
        small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((size, size), Image.BILINEAR).save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())
    return jpegs


def batched(jpegs: list, batch_size: int) -> list:
    """``jpegs`` in batches as a loader gives a ``binary`` column: ``image`` -> list of bytes, ``label`` -> numpy
    array (the row's index)."""
    return [{"image": jpegs[i:i + batch_size], "label": np.arange(i, min(i + batch_size, len(jpegs)))}
            for i in range(0, len(jpegs), batch_size)]


def make_batches(images: int, size: int, batch_size: int) -> list:
    return batched(make_jpegs(images, size), batch_size)


def _one_thread():
    torch.set_num_threads(1)  # as TransformWorkers' workers run: one intra-op thread each


def _one_thread_noop(_):
    return None


def count(batches) -> int:
    return sum(len(b["label"]) for b in batches)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="rounds (the ways take turns within a round)")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)

    from spark_dist.data.read.transform_workers import TransformWorkers

    batches = make_batches(args.images, args.size, args.batch_size)
    jpeg_bytes = sum(len(j) for b in batches for j in b["image"])
    k = args.workers

    t0 = time.perf_counter()
    pool = multiprocessing.get_context("fork").Pool(k, initializer=_one_thread)
    pool.map(_one_thread_noop, range(k))
    pool_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    stage = TransformWorkers(decode_augment, workers=k, dataset="bench", seed=0)
    list(stage.map(batches[:k], epoch=-1))  # every worker up
    stage_start = time.perf_counter() - t0
    inline = TransformWorkers(decode_augment, workers=0, dataset="bench", seed=0)

    ways = {
        f"(a) multiprocessing.Pool({k}).imap (ceiling)": lambda: count(pool.imap(decode_augment, batches)),
        f"(b) TransformWorkers(workers={k}).map": lambda: count(stage.map(batches, epoch=0)),
        "(c) TransformWorkers(workers=0): in this process": lambda: count(inline.map(batches, epoch=0)),
    }
    results = {name: {"images_per_s": 0.0, "rounds_images_per_s": [], "cpu_s": None} for name in ways}
    try:
        for _ in range(args.repeat):
            for name, run in ways.items():
                t0, c0 = time.perf_counter(), time.process_time()
                n = run()
                rate, cpu = n / (time.perf_counter() - t0), time.process_time() - c0
                r = results[name]
                r["cpu_s"] = cpu if r["cpu_s"] is None else min(r["cpu_s"], cpu)
                r["images_per_s"] = max(r["images_per_s"], rate)
                r["rounds_images_per_s"].append(rate)
    finally:
        stage.close()
        pool.close()
        pool.join()

    ceiling, ours = results[next(iter(ways))], results[list(ways)[1]]
    ratio_best = ours["images_per_s"] / ceiling["images_per_s"]
    ratio_median = statistics.median(o / c for o, c in zip(ours["rounds_images_per_s"], ceiling["rounds_images_per_s"]))
    print(f"\n{args.images} JPEGs {args.size}x{args.size} ({jpeg_bytes / args.images / 1024:.1f} KiB each), batches of "
          f"{args.batch_size}, {k} workers, {args.repeat} rounds; start: Pool {pool_start:.2f} s, "
          f"TransformWorkers {stage_start:.2f} s\n")
    print("| way | images/s (best) | of ceiling (best) | of ceiling (median per round) | this process's CPU s |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        r["vs_ceiling"] = r["images_per_s"] / ceiling["images_per_s"]
        per_round = [x / c for x, c in zip(r["rounds_images_per_s"], ceiling["rounds_images_per_s"])]
        r["vs_ceiling_median_round"] = statistics.median(per_round)
        print(f"| {name} | {r['images_per_s']:,.0f} | {r['vs_ceiling']:.0%} | {r['vs_ceiling_median_round']:.0%} "
              f"| {r['cpu_s']:.2f} |")
    print(f"\nratio (b)/(a): {ratio_best:.2f} (best rounds), {ratio_median:.2f} (median per round)")
    report = {"images": args.images, "size": args.size, "batch_size": args.batch_size, "workers": k,
              "jpeg_bytes_mean": jpeg_bytes / args.images, "repeat": args.repeat,
              "start_seconds": {"pool": pool_start, "transform_workers": stage_start},
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__},
              "ways": results, "ratio_best": ratio_best, "ratio_median_round": ratio_median}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
