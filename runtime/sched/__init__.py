"""Scheduling: requests and their state machine, the scheduler, its step records, the engines' batch records, the SLO policy and the step-cost model it plans with."""
