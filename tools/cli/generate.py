import click
@click.command("generate")
def generate_command():
    """(runtime pending)"""
