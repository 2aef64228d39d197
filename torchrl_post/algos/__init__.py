"""Algorithm math as pure tensor functions: advantage estimators, policy losses, aggregation."""
