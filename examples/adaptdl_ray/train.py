"""A tiny elastic AdaptDL job for adaptdl-ray: linear regression on synthetic data.

    adaptdl-ray -u ray://HEAD:10001 -f train.py -m 2 --cpus 1 -- --epochs 20

Replica 0 prints one line an epoch:
`epoch E loss L replicas N restarts R samples S` (S: the samples the epoch
trained on, counted once each however the epoch was cut by restarts). When the job rescales (a node joins
or goes, a spot notice) AdaptDL saves its state, the workers restart with the
new number of replicas, and the lines go on from the saved epoch with the
loss where it was, not from the start.
"""
import argparse
import time

import numpy

# adaptdl 0.2.11's batch-size autoscaling (its goodput model) still calls
# numpy.int, which numpy removed in 1.24: restore the alias before it is used.
numpy.int = int

import torch  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

FEATURES = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="extra time per batch, standing in for a real model's work (default %(default)s)")
    parser.add_argument("--autoscale-bsz", "-autoscale-bsz", action="store_true",  # the second: the guide's
                        help="let AdaptDL choose the batch size as the replicas change")
    return parser.parse_args()


def synthetic(samples: int) -> TensorDataset:
    """y = x.w + noise, the same on every replica (seeded)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, FEATURES, generator=generator)
    weight = torch.randn(FEATURES, 1, generator=generator)
    return TensorDataset(x, x @ weight + 0.01 * torch.randn(samples, 1, generator=generator))


def main() -> None:
    # Here, not at the top: importing adaptdl.torch takes over SIGTERM, which only a main
    # thread may, and bench/bench_ray_rescale.py imports this module's model and data in
    # Ray Train's worker thread to train the same job there.
    import adaptdl.env
    import adaptdl.torch as adl

    args = parse_args()
    adl.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model = adl.AdaptiveDataParallel(model, optimizer)
    loader = adl.AdaptiveDataLoader(synthetic(args.samples), batch_size=32, shuffle=True, drop_last=True)
    if args.autoscale_bsz:
        loader.autoscale_batch_size(256, local_bsz_bounds=(16, 128))
    totals = adl.Accumulator()  # checkpointed too: an epoch cut by a restart keeps its sums
    for epoch in adl.remaining_epochs_until(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            totals["loss"] += loss.item() * len(x)
            totals["samples"] += len(x)
            time.sleep(args.step_seconds)
        with totals.synchronized():
            if adaptdl.env.replica_rank() == 0:
                print(f"epoch {epoch} loss {totals['loss'] / totals['samples']:.6f} "
                      f"replicas {adaptdl.env.num_replicas()} restarts {adaptdl.env.num_restarts()} "
                      f"samples {totals['samples']}", flush=True)
            totals["loss"], totals["samples"] = 0.0, 0  # the next epoch's sums


if __name__ == "__main__":
    main()
