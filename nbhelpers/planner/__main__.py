"""`python -m nbhelpers.planner MODEL --gpus N ...`: the memory planner's verdict on the command line (command_line.main)."""
from nbhelpers.planner.command_line import main

main()
