"""A tiny AdaptDL training run: CPU, gloo, a linear model on synthetic data.

    scripts/run.sh python examples/adaptdl/train.py [--epochs 5] [--step-seconds 0.02]

Under trialkit's keeper it gets AdaptDL's environment (checkpoint dir, restart
count). SIGTERM (the keeper forwards it, e.g. from scripts/cleanup.sh) makes
AdaptDL save its state at the second batch boundary after the signal and exit
143; run again with the restart count one higher and training resumes from that
checkpoint: same epoch, next sample, same running totals.

Each batch prints `epoch E samples A-B size N` (the first and last sample
index of the batch: the data position), and each epoch's end
`epoch E done: T trained this epoch, S in all`, counted by a checkpointed
Accumulator. To check that a resumed run continues where the first one
stopped: its first batch is the sample after the first run's last one, and T
and S are the sums of the sizes of the batch lines before them, both runs
together: no batch lost or trained twice across the restart. Not E x 512: with
batch-size autoscaling an AdaptDL epoch lasts until its statistical progress
(its goodput model's gain) reaches one pass over the data, so an epoch can go
on past the data's end, from sample 0 again (epoch 0 here: 33 batches, 0-15
twice, whether or not trialkit's checkpoint hook is on).
"""
import argparse
import time

import numpy

# adaptdl 0.2.11 fits its goodput model after 30 s of training and from then on
# picks batch sizes with it (autoscale_batch_size below), calling numpy.int,
# which numpy removed in 1.24: restore the alias before that can happen.
numpy.int = int

import adaptdl.torch as adl  # noqa: E402  (after the numpy fix)
import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

SAMPLES = 512
FEATURES = 8


class Synthetic(Dataset):
    """y = x.w + noise; each item also carries its own index, to show the data position."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, FEATURES, generator=generator)
        weight = torch.randn(FEATURES, 1, generator=generator)
        self.y = self.x @ weight + 0.01 * torch.randn(SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return index, self.x[index], self.y[index]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.02,
                        help="extra time per batch, standing in for real work (default %(default)s)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    adl.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model = adl.AdaptiveDataParallel(model, optimizer)
    # shuffle=False keeps sample indices in order, so the position is easy to read.
    loader = adl.AdaptiveDataLoader(Synthetic(), batch_size=16, shuffle=False)
    loader.autoscale_batch_size(64, local_bsz_bounds=(8, 32))
    totals = adl.Accumulator()  # checkpointed with the model, the optimizer and the loader
    for epoch in adl.remaining_epochs_until(args.epochs):
        for index, x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            totals["samples"] += len(index)
            totals[f"epoch {epoch}"] += len(index)  # AdaptDL's epoch, which can run past the data's end
            print(f"epoch {epoch} samples {int(index[0])}-{int(index[-1])} size {len(index)} "
                  f"loss {loss.item():.4f}", flush=True)
            time.sleep(args.step_seconds)
        with totals.synchronized():  # only between dataloader loops
            print(f"epoch {epoch} done: {int(totals[f'epoch {epoch}'])} trained this epoch, "
                  f"{int(totals['samples'])} in all", flush=True)
    print("training done", flush=True)


if __name__ == "__main__":
    main()
