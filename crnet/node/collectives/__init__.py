"""The job's collectives beside the steps: which job is attached, broadcasts, barriers, and
state requests and their answers."""
