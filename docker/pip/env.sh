# Sourced by the image's build stage: pip takes this folder's pip.conf where `make image` wrote one.
if [ -f /pip/pip.conf ]; then export PIP_CONFIG_FILE=/pip/pip.conf; fi
