"""`python3 -m determined.launch.torch_distributed`: trialkit.launch.torch_distributed, same arguments."""
from . import run_as

if __name__ == "__main__":
    run_as("trialkit.launch.torch_distributed")
