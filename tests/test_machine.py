"""The CPU's name in reports and cache keys tells apart machines whose model name is the same (via_sd/weights/machine.py)."""

from via_sd.core.profile import profile_key
from via_sd.weights.machine import cpu_name, describe_cpu


def cpuinfo(vendor: str, family: int, model: int, name: str) -> str:
    block = f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: {name}\n"
    return block.format(0) + "\n" + block.format(1).replace(name, "a second processor")


def test_amd_epyc_vms_of_three_generations_get_three_names():
    names = [describe_cpu(cpuinfo("AuthenticAMD", family, model, "AMD EPYC"))
             for family, model in ((25, 1), (25, 17), (26, 2))]
    assert names == ["AMD EPYC (Zen 3; family 25, model 1)", "AMD EPYC (Zen 4; family 25, model 17)",
                     "AMD EPYC (Zen 5; family 26, model 2)"]


def test_an_intel_cpu_keeps_its_name_with_its_family_and_model():
    assert describe_cpu(cpuinfo("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8488C")) == \
        "Intel(R) Xeon(R) Platinum 8488C (family 6, model 143)"


def test_a_cpuinfo_without_family_or_name():
    assert describe_cpu("processor\t: 0\nmodel name\t: Some CPU\n") == "Some CPU"
    assert describe_cpu("processor\t: 0\nFeatures\t: fp asimd\n") is None  # e.g. an ARM board: the platform's words


def test_the_cost_profile_is_keyed_by_the_described_cpu(tiny_pair):
    name = cpu_name()
    assert name and profile_key(tiny_pair)["device_name"] == name
