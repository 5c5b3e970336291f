"""`python3 -m determined.launch.deepspeed`: trialkit.launch.deepspeed, same arguments."""
from . import run_as

if __name__ == "__main__":
    run_as("trialkit.launch.deepspeed")
