import unittest

from slug import slugify


class SlugTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_accents(self):
        self.assertEqual(slugify("Crème brûlée"), "creme-brulee")

    def test_edges(self):
        self.assertEqual(slugify("  --a--  "), "a")
