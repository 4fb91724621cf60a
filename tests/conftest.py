pytest_plugins = ["tests.fixtures.controller"]
