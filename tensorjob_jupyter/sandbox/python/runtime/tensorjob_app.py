"""The interpreter's entry points (componentize-py's app module for ``wit/guest.wit``).

componentize-py runs this module once, when it builds the interpreter, and
snapshots the initialised interpreter: every module imported here is in the
snapshot, ready at no cost, and *only* these (the built interpreter has no
file system to import anything else from). The list is the standard library
a guest can use: what the issue promised, plus what they need.
"""

# The standard library a guest can import (imported here so the snapshot holds it).
import abc  # noqa: F401
import array  # noqa: F401
import base64  # noqa: F401
import binascii  # noqa: F401
import bisect  # noqa: F401
import calendar  # noqa: F401
import cmath  # noqa: F401
import codecs  # noqa: F401
import collections  # noqa: F401
import collections.abc  # noqa: F401
import contextlib  # noqa: F401
import copy  # noqa: F401
import csv  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import difflib  # noqa: F401
import enum  # noqa: F401
import fnmatch  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
import graphlib  # noqa: F401
import hashlib  # noqa: F401
import heapq  # noqa: F401
import hmac  # noqa: F401
import html  # noqa: F401
import html.parser  # noqa: F401
import io  # noqa: F401
import itertools  # noqa: F401
import json  # noqa: F401
import keyword  # noqa: F401
import linecache  # noqa: F401
import math  # noqa: F401
import numbers  # noqa: F401
import operator  # noqa: F401
import os  # noqa: F401
import pprint  # noqa: F401
import random  # noqa: F401
import re  # noqa: F401
import secrets  # noqa: F401
import shlex  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import struct  # noqa: F401
import sys  # noqa: F401
import textwrap  # noqa: F401
import time  # noqa: F401
import tomllib  # noqa: F401
import traceback  # noqa: F401
import types  # noqa: F401
import typing  # noqa: F401
import unicodedata  # noqa: F401
import urllib.parse  # noqa: F401
import uuid  # noqa: F401
import warnings  # noqa: F401
import weakref  # noqa: F401
import zlib  # noqa: F401

import tensorjob
import wit_world


class WitWorld(wit_world.WitWorld):
    def run(self, source: str, filename: str, input: str) -> str:
        return tensorjob._run(source, filename, input)

    def check(self, source: str, filename: str) -> str:
        return tensorjob._check(source, filename)
