"""The starter registry ``veil init`` writes: one commented metric of every kind and mechanism.

The repository's ``examples/metrics.toml`` holds the same text (a test keeps them equal);
it lives here so that an installed Veil carries it.
"""

METRICS_TOML = """\
# Veil metric registry: every metric clients may report, how it is randomized on the
# device, and what it costs in privacy.
#
# The collector serves this file to clients (GET /v1/metrics) and records it in its
# database. Check it, and see the oracle each `oracle = "auto"` picks, with:
#
#     veil metrics --config metrics.toml
#
# Privacy figures below are worst cases for one installation (one person), as
# `veil metrics` prints them:
#   epsilon_1    what one report reveals about the value it carries;
#   epsilon_inf  what all reports of one value reveal together, however many: each
#                randomized response is derived from the installation's secret and
#                memoized per value, so reporting a value again reveals nothing more.
# A metric reported with several distinct values costs epsilon_inf for each distinct
# value: the client's privacy ledger charges every new value, and `Client(budget=...)`
# caps the installation's total. Metrics add up (a string metric and its discovery
# channel count once, at the larger of the two, since an installation reports through
# one of them): an installation reporting one value of every metric below spends at
# most epsilon_total = 33.69.
#
# Parameters are permanent once the collector has recorded them: to change a metric's
# parameters, publish it under a new name (e.g. homepage.v2). Description and
# min_reports may change at any time.
#
# Every metric kind and mechanism Veil supports appears once below; delete what you do
# not need.

version = 1

# A string from an open set (Bloom-filter RAPPOR): the analysis finds which of a list
# of candidate strings are common and how common (veil decode --candidates).
# privacy: epsilon_1 = 1.074 per report; epsilon_inf = 4.394 per distinct value.
# An installation whose home page changed to 3 different hosts has spent 3 x 4.394.
[metrics.homepage]
kind = "string"
description = "Host name of the configured home page"
min_reports = 1000      # counts are released only for ranges with at least this many reports
k = 128                 # Bloom filter bits per report
h = 2                   # hash functions (bits set per value)
m = 64                  # cohorts (each hashes with its own seeds)
p = 0.5                 # instantaneous response: P(report 1 | permanent bit 0)
q = 0.75                # instantaneous response: P(report 1 | permanent bit 1)
f = 0.5                 # permanent response: share of bits replaced by coin flips
hashing = "mmh3"        # "md5-google": google/rappor's hashing (h <= 16, k <= 256)

# A string nobody can list in advance, with discovery: the [metrics.landing_path.discovery]
# table below sends 90% of installations to a discovery channel (the metric
# landing_path.discovery), where each reports one 2-byte segment of the value's prefix;
# veil discover finds the frequent values, and the string channel (the other 10%)
# estimates them (docs/discovery.md). One report per installation is the usual case,
# so there is no instantaneous response (p = 0, q = 1).
# privacy: epsilon_1 = 3.985 per report; epsilon_inf = 3.985 per distinct value.
[metrics.landing_path]
kind = "string"
description = "Path of the first page opened"
min_reports = 1000
k = 128
h = 1
m = 64
p = 0.0
q = 1.0
f = 0.24

# Each installation reports through one channel only: the metric costs the larger of
# the two epsilons, never their sum.
# privacy: epsilon_1 = 4 per report; epsilon_inf = 4 per distinct value.
[metrics.landing_path.discovery]
description = "Discovery channel of landing_path"
min_reports = 1000
share = 0.9             # installations on the discovery channel
segment = 2             # bytes added per level
max_length = 64         # bytes of a value that can be discovered
epsilon = 4.0

# A category from a known list; oracle = "auto" picks the frequency oracle of lowest
# variance for this epsilon and list (here: grr). epsilon bounds all reports of one
# value, report_epsilon (default epsilon / 2) one report.
# privacy: epsilon_1 = 1 per report; epsilon_inf = 2 per distinct value.
# An installation that reported all 6 categories over time has spent 6 x 2.
[metrics.browser]
kind = "category"
description = "Web browser in use"
min_reports = 500
oracle = "auto"
categories = ["firefox", "chrome", "safari", "edge", "opera", "other"]
epsilon = 2.0

# A category with basic one-time RAPPOR (the default oracle: no `oracle` key): one
# bit per category, then RAPPOR's permanent (f) and instantaneous (p, q) responses.
# privacy: epsilon_1 = 0.5371 per report; epsilon_inf = 2.197 per distinct value.
[metrics.os]
kind = "category"
description = "Operating system family"
min_reports = 500
categories = ["windows", "macos", "linux", "android", "ios", "other"]
p = 0.5
q = 0.75
f = 0.5

# Generalized randomized response: one small integer per report; the best oracle
# for short lists (fewer than about 3 e^epsilon + 2 categories).
# privacy: epsilon_1 = 1 per report; epsilon_inf = 2 per distinct value.
[metrics.language]
kind = "category"
description = "User interface language"
min_reports = 500
oracle = "grr"
categories = ["en", "de", "fr", "es", "other"]
epsilon = 2.0
report_epsilon = 1.0

# Optimized unary encoding: one bit per category (reports grow with the list).
# privacy: epsilon_1 = 0.5 per report; epsilon_inf = 1 per distinct value.
[metrics.screen]
kind = "category"
description = "Screen width class, in pixels"
min_reports = 500
oracle = "oue"
categories = ["<800", "800-1279", "1280-1919", "1920-2559", "2560+"]
epsilon = 1.0

# Optimized local hashing: the variance of OUE with reports of a few bytes; suits
# long lists.
# privacy: epsilon_1 = 1.5 per report; epsilon_inf = 3 per distinct value.
[metrics.country]
kind = "category"
description = "Country of the installation's locale"
min_reports = 500
oracle = "olh"
categories = ["us", "gb", "de", "fr", "in", "br", "jp", "cn", "ru", "other"]
epsilon = 3.0

# Hadamard response: one row index of a Hadamard matrix per report; small reports
# and a fast decoder for long lists at small epsilon.
# privacy: epsilon_1 = 0.5 per report; epsilon_inf = 1 per distinct value.
[metrics.app_version]
kind = "category"
description = "Application version"
min_reports = 500
oracle = "hadamard"
categories = ["1.0", "1.1", "1.2", "2.0", "2.1", "other"]
epsilon = 1.0

# A yes/no value, Warner's randomized response: the true answer with probability
# alpha, otherwise "yes" with probability beta.
# privacy: epsilon_1 = 1.099 per report; epsilon_inf = 1.099 per distinct value.
# An installation that reported both true and false over time has spent 2 x 1.099.
[metrics.dark_mode]
kind = "boolean"
description = "Dark mode is on"
min_reports = 200
alpha = 0.5
beta = 0.5

# A number in [low, high], rounded to a grid of `resolution` steps, plus discrete
# Laplace noise: the analysis estimates the population mean.
# privacy: epsilon_1 = 1 per report; epsilon_inf = 1 per distinct value.
# Each distinct grid point reported (up to resolution + 1 = 65) costs that again.
[metrics.load_time]
kind = "number"
description = "Page load time in seconds, clipped to [0, 10]"
min_reports = 200
mechanism = "laplace"
low = 0.0
high = 10.0
resolution = 64
epsilon = 1.0

# The same with discrete Gaussian noise: (epsilon, delta)-LDP.
# privacy: epsilon_1 = 1 per report; epsilon_inf = 1 per distinct value.
[metrics.session_minutes]
kind = "number"
description = "Session length in minutes, clipped to [0, 120]"
min_reports = 200
mechanism = "gaussian"
low = 0.0
high = 120.0
resolution = 120
epsilon = 1.0
delta = 1e-6

# 1BitMean (Ding, Kulkarni, Yekhanin 2017): one bit per report, 1 more often for
# larger values.
# privacy: epsilon_1 = 1 per report; epsilon_inf = 1 per distinct value.
[metrics.battery]
kind = "number"
description = "Battery charge in percent"
min_reports = 200
mechanism = "1bitmean"
low = 0.0
high = 100.0
resolution = 100
epsilon = 1.0

# A string from an open set through fast local hashing (oracle = "flh"): each
# installation hashes with its cohort's function of a fixed pool into a few buckets, so a
# report is about 16 bits; the collector keeps counts per (function, bucket) and decodes
# any candidate list without reading reports (docs/strings.md).
# privacy: epsilon_1 = 2 per report; epsilon_inf = 4 per distinct value.
[metrics.search_engine]
kind = "string"
description = "Search engine host"
min_reports = 1000
oracle = "flh"
epsilon = 4.0

# The same through Apple's Hadamard count-mean sketch (oracle = "hcms"): one bit and a
# sketch position per report.
# privacy: epsilon_1 = 2 per report; epsilon_inf = 4 per distinct value.
[metrics.download_host]
kind = "string"
description = "Download host"
min_reports = 1000
oracle = "hcms"
epsilon = 4.0

# How two things relate: a joint metric reports the tuple (browser, crashed) in one
# report, as one cell of the product domain (docs/association.md); GRR is the oracle of
# lowest variance for 10 cells at this epsilon (encoding = "auto" would choose it too).
# privacy: epsilon_1 = 1 per report; epsilon_inf = 2 per distinct value.
[metrics.crash_by_browser]
kind = "joint"
description = "Whether the app crashed, by browser"
min_reports = 1000
of = ["browser", "crashed"]
domains = [["chrome", "firefox", "safari", "edge", "other"], "boolean"]
encoding = "grr"
epsilon = 2.0
"""
