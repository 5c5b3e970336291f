"""`python3 -m determined.launch.horovod`: trialkit.launch.horovod, same arguments."""
from . import run_as

if __name__ == "__main__":
    run_as("trialkit.launch.horovod")
