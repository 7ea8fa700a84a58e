"""Profile handlers: choose which profiles run, and merge their results."""
