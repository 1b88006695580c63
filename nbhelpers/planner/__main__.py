"""`python -m nbhelpers.planner MODEL --gpus N ...`: the memory planner's verdict on the command line (plan.main)."""
from nbhelpers.planner.plan import main

main()
