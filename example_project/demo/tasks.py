"""Handlers for the demo jobs that the example project schedules."""
