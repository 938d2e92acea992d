"""(being written)"""


def add_parser(sub, *argument_adders):
    pass
