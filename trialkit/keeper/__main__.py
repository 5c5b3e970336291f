import sys

from trialkit.keeper.main import main

sys.exit(main())
