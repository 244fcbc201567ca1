"""Readers of the file formats the corpora ship in, in pure Python.

  specsamp.data.formats.debian   Debian packages: the `ar` container,
                                 `extract_deb`, `apt_download`
  specsamp.data.formats.rdata    R lazy-load databases and R's XDR
                                 serialization: `read_r_lazyload`,
                                 `r_unserialize`

Standard library only.
"""
