import unittest


class TestParseDuration(unittest.TestCase):

    def test_seconds(self):
        self.assertEqual(parse_duration("45s"), 45)
        self.assertEqual(parse_duration("0s"), 0)

    def test_minutes(self):
        self.assertEqual(parse_duration("3m"), 180)
        self.assertEqual(parse_duration("0m"), 0)

    def test_hours(self):
        self.assertEqual(parse_duration("2h"), 7200)
        self.assertEqual(parse_duration("0h"), 0)

    def test_days(self):
