from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_out_of_memory_and_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrecord",
            name="interactive",
            field=models.BooleanField(
                default=False, help_text="An allocation of salloc or srun: no batch step."
            ),
        ),
        migrations.AddField(
            model_name="jobrecord",
            name="steps",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="Its job steps (srun), as the job object's `steps`.",
            ),
        ),
    ]
