"""`python3 -m determined.launch.wrap_rank`: trialkit.launch.wrap_rank, same arguments."""
from . import run_as

if __name__ == "__main__":
    run_as("trialkit.launch.wrap_rank")
