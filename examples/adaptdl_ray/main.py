"""The guide's example script (`-f main.py`, AdaptDL's pytorch-cifar example there): this folder's train.py,
a small AdaptDL job that runs on CPUs, under that name. `-autoscale-bsz`, as the guide writes it, lets
AdaptDL choose the batch size."""
from train import main

if __name__ == "__main__":
    main()
