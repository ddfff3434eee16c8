"""The string formats guided JSON holds to (json_schema.py's `format`): each format's regex, one
common spelling of it (RFC 3339, RFC 1123, RFC 3986, RFC 4122, RFC 4291...), so that an output is
a valid instance whichever validator checks the format. Digits are [0-9], since Python's \\d
also takes other scripts' digits.
"""

from __future__ import annotations

_DATE = (r"[1-9][0-9]{3}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         r"|02-(0[1-9]|1[0-9]|2[0-8]))")  # no February 29: a leap year is more than a regex says
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,60}[A-Za-z0-9])?"  # RFC 1123, at most 62 characters
_HOSTNAME = rf"({_LABEL}\.){{0,3}}[A-Za-z]([A-Za-z0-9-]{{0,60}}[A-Za-z0-9])?"  # 4 labels: <= 253
_IPV4 = r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16 = "[0-9a-fA-F]{1,4}"
_IPV6 = "|".join((  # RFC 4291's text forms, "::" standing for the zeros it leaves out
    f"({_H16}:){{7}}{_H16}", f"({_H16}:){{1,7}}:", f":(:{_H16}){{1,7}}", "::",
    *(f"({_H16}:){{1,{k}}}(:{_H16}){{1,{7 - k}}}" for k in range(1, 7))))
_DIGITS = "[0-9]{1,4}"
# RFC 3339's ABNF (appendix A): each part leads only to the next one down (dur-hour = 1*DIGIT "H"
# [dur-minute]): P1Y2D and PT1H2S skip one and are no durations
_CLOCK = f"T({_DIGITS}H({_DIGITS}M({_DIGITS}S)?)?|{_DIGITS}M({_DIGITS}S)?|{_DIGITS}S)"
_CALENDAR = f"{_DIGITS}Y({_DIGITS}M({_DIGITS}D)?)?|{_DIGITS}M({_DIGITS}D)?|{_DIGITS}D"
_ATOM = "[A-Za-z0-9_%+-]"  # of RFC 5322's atext, the characters every validator takes
# a dot-atom (no dot first, last or twice) of at most 64 characters, at a domain of RFC 1123 labels
_EMAIL = rf"{_ATOM}{{1,32}}(\.{_ATOM}{{1,15}}){{0,2}}@({_LABEL}\.){{1,3}}[A-Za-z]{{2,24}}"
_URI_CHAR = r"([A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"  # RFC 3986's pchar
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "duration": f"P(({_CALENDAR})({_CLOCK})?|{_CLOCK}|{_DIGITS}W)",  # RFC 3339, appendix A
    "hostname": _HOSTNAME,
    "ipv6": f"({_IPV6})",
    # an absolute URI with a host (RFC 3986): scheme://host[:port][/path][?query][#fragment]
    "uri": (rf"[A-Za-z][A-Za-z0-9+.-]{{0,15}}://({_HOSTNAME}|{_IPV4})(:[0-9]{{1,5}})?(/{_URI_CHAR}*)*"
            rf"(\?({_URI_CHAR}|[/?])*)?(#({_URI_CHAR}|[/?])*)?"),
    "email": _EMAIL,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": _IPV4,
}
