"""Validate's measuring side (it runs on the device): workloads, budgets, goodput, teacher forcing, the step-cost model's error, reports, and the HTTP client that measures a server."""
